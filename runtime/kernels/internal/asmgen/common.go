package main

// Pieces shared by the one-row and the multi-row kernels, which walk the
// groups the same way (see oneRowHeader): a row loop restarting the
// activation pointers, runs of eight groups of one block ("oct"), then one
// group at a time.

// labels returns the function that names a kernel's labels.
func labels(name string) func(string) string {
	return func(s string) string { return name + "_" + s }
}

// rowStart writes the row loop's label and the activation pointers' and
// group count's restart.
func rowStart(a *asm, l func(string) string) {
	a.label(l("row"))
	a.movs([2]string{"xq+0(FP)", "DI"}, [2]string{"xs+8(FP)", "R12"},
		[2]string{"xsum+16(FP)", "R13"}, [2]string{"ng+48(FP)", "R10"})
}

// octStart writes the head of the eight-groups loop: leave for tail when
// fewer than eight groups are left, the eight scales into Y0, then (after
// scaled, which may use Y0) the eight zero-points into Y1 (zsym when zeros
// is nil; zoff subtracted by shift where not nil), and Y1 = s·z.
func octStart(a *asm, l func(string) string, scaled, shift func()) {
	a.label(l("oct"))
	a.op("CMPQ", "R10", "$8")
	a.jmp("JLT", l("tail"))
	a.op("VCVTPH2PS", "(R8)", "Y0")
	scaled()
	a.op("TESTQ", "R9", "R9")
	a.jmp("JZ", l("octsym"))
	a.op("VCVTPH2PS", "(R9)", "Y1")
	shift()
	a.jmp("JMP", l("octz"))
	a.label(l("octsym"))
	a.op("VBROADCASTSS", "zsym+64(FP)", "Y1")
	a.label(l("octz"))
	a.op("VMULPS", "Y0", "Y1", "Y1")
}

// octNext writes the step of every pointer past eight groups of one block
// of bb code bytes and the jump back to the loop's head.
func octNext(a *asm, l func(string) string, bb int) {
	a.op("ADDQ", "$16", "R8")
	a.op("TESTQ", "R9", "R9")
	a.jmp("JZ", l("octnext"))
	a.op("ADDQ", "$16", "R9")
	a.label(l("octnext"))
	a.op("ADDQ", "$32", "R12")
	a.op("ADDQ", "$32", "R13")
	a.op("ADDQ", "$256", "DI")
	a.op("ADDQ", imm(8*bb), "SI")
	a.op("SUBQ", "$8", "R10")
	a.jmp("JMP", l("oct"))
}

// groupStart writes the head of the one-group loop: s_g into X0 (then
// kept by keep), z_g into X1 (zsym when zeros is nil; zoff subtracted by
// shift where not nil), the scale and zero pointers stepped, up to the
// label blocks.
func groupStart(a *asm, l func(string) string, keep, shift func()) {
	a.label(l("group"))
	a.op("MOVWLZX", "(R8)", "AX")
	a.op("VMOVD", "AX", "X0")
	a.op("VCVTPH2PS", "X0", "X0")
	keep()
	a.op("ADDQ", "$2", "R8")
	a.op("VMOVSS", "zsym+64(FP)", "X1")
	a.op("TESTQ", "R9", "R9")
	a.jmp("JZ", l("blocks"))
	a.op("MOVWLZX", "(R9)", "AX")
	a.op("VMOVD", "AX", "X1")
	a.op("VCVTPH2PS", "X1", "X1")
	shift()
	a.op("ADDQ", "$2", "R9")
	a.label(l("blocks"))
}

// blockStep writes the step of the pointers past one block of bb code
// bytes (xsum's pointer too when sum) and the jump back to label block.
func blockStep(a *asm, l func(string) string, bb int, sum bool) {
	a.op("ADDQ", "$4", "R12")
	if sum {
		a.op("ADDQ", "$4", "R13")
	}
	a.op("ADDQ", "$32", "DI")
	a.op("ADDQ", imm(bb), "SI")
	a.op("DECQ", "CX")
	a.jmp("JNZ", l("block"))
	a.blank()
}

// none is an empty hook.
func none() {}
