package main

import (
	"fmt"
	"strings"
)

// asm accumulates the text of one Go assembly file. Every method writes
// whole lines in the layout of the committed files: instructions indented
// by one tab, operands separated by ", ", conditional and unconditional
// jumps with the mnemonic padded to four characters, labels preceded by an
// empty line.
type asm struct {
	b strings.Builder
}

// raw writes s unchanged (comment blocks, directives; s ends in a newline).
func (a *asm) raw(s string) { a.b.WriteString(s) }

// op writes one instruction line: the mnemonic, then the operands.
func (a *asm) op(mnemonic string, operands ...string) {
	a.b.WriteString("\t" + mnemonic)
	if len(operands) > 0 {
		a.b.WriteString(" " + strings.Join(operands, ", "))
	}
	a.b.WriteString("\n")
}

// jmp writes a jump to a label, the mnemonic padded to four characters.
func (a *asm) jmp(mnemonic, label string) {
	fmt.Fprintf(&a.b, "\t%-4s %s\n", mnemonic, label)
}

// label writes an empty line and the label.
func (a *asm) label(name string) { a.b.WriteString("\n" + name + ":\n") }

// blank writes an empty line.
func (a *asm) blank() { a.b.WriteString("\n") }

// data writes a read-only table of n elements of size bytes each, element
// k the value v(k), and its GLOBL line.
func (a *asm) data(name string, size, n int, v func(k int) int) {
	for k := 0; k < n; k++ {
		fmt.Fprintf(&a.b, "DATA %s<>+%d(SB)/%d, $%d\n", name, k*size, size, v(k))
	}
	fmt.Fprintf(&a.b, "GLOBL %s<>(SB), RODATA|NOPTR, $%d\n", name, size*n)
}

// imm is an immediate operand.
func imm(v int) string { return fmt.Sprintf("$%d", v) }

// off is a memory operand base register plus a byte displacement,
// written with an explicit 0 as the committed files do: "0(SI)".
func off(d int, base string) string { return fmt.Sprintf("%d(%s)", d, base) }

// reg names vector register n of a class: "X", "Y" or "Z".
func reg(class string, n int) string { return fmt.Sprintf("%s%d", class, n) }

// text writes a kernel's Go declaration comment and TEXT line: frame bytes
// of locals, argument bytes.
func (a *asm) text(name, signature string, frame, args int) {
	a.raw("// func " + name + signature + "\n")
	fmt.Fprintf(&a.b, "TEXT ·%s(SB), NOSPLIT, $%d-%d\n", name, frame, args)
}

// movs writes MOVQ src, dst for each pair {src, dst}.
func (a *asm) movs(pairs ...[2]string) {
	for _, p := range pairs {
		a.op("MOVQ", p[0], p[1])
	}
}

// zero writes VXORPS r, r, r for each register r.
func (a *asm) zero(regs ...string) {
	for _, r := range regs {
		a.op("VXORPS", r, r, r)
	}
}
