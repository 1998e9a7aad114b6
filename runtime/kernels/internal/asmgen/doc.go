// Command asmgen writes the integer-dot-product assembly of package
// kernels: qdot8_amd64.s (one activation row), qdot8m_amd64.s (four
// activation rows), qdot8p_amd64.s (one activation row, two packed rows
// at once in AVX-512) and qdot8act_amd64.s (QuantizeActQ8's blocks of 32).
// The .s files are its output and are committed; edit this generator, run
// `go generate ./runtime/kernels` (the directive is in
// runtime/kernels/asmgen.go), and commit both. TestAsmgenUpToDate in
// package kernels runs it into a temporary directory and fails, naming the
// file and the first differing line, when a committed file differs.
//
// Usage:
//
//	go run ./internal/asmgen [-out dir]
//
// writes the three files into dir (default: the current directory, which
// go generate sets to runtime/kernels).
//
// # What is generated from what
//
// The algorithms are described in the comment blocks the generator writes
// at the top of each file (oneRowHeader, multiRowHeader, actHeader); the
// numerics are those of docs/METHODS.md §3 (q8_0-style blocks of 32). Each
// kernel is emitted by one Go function from its parameters instead of
// copies:
//
//   - width (widths.go): the code width (8, 4, 2, 1 bits), its byte
//     constant, how a block's bits·4 bytes are spread over the lanes
//     (load and variable shift for one block, pairLoad/spread for two
//     blocks in a Z register) and its shift and index tables;
//   - isa: AVX2 (vpmaddubsw + vpmaddwd; 8 bits by the sign trick on c−128)
//     or AVX-512 VNNI (vpdpbusd);
//   - the unroll: eight groups of one block a pass (the "oct" loop; the
//     VNNI four-row kernels take them two blocks a Z register), with the
//     totals of even and odd blocks alternating;
//   - rows per call: one (oneRowKernel) or multiRows = 4 (multiRowKernel),
//     whose register assignment (Y5-Y8 even totals, Y10-Y13 odd totals,
//     strides in R14/DX and R15/BX) and stack layout (the stack*
//     constants) the header comment documents.
//
// The output is byte for byte the files as they were written by hand-run
// scripts before this generator existed, so the kernels' tests and
// timings carry over unchanged.
//
// # Why not avo
//
// github.com/mmcloughlin/avo (v0.5.0 is served by the module proxy here)
// was considered first. It has the instructions these kernels use, can
// pin physical registers and name labels, so it could express the same
// code; but its printer (printer/goasm.go) always starts a file with its
// own "Code generated" warning, has no file-level comment blocks (comments
// are function nodes, printed indented inside a TEXT), replaces each
// kernel's doc comment by the Go stub and a "Requires:" line, and aligns
// operands in columns per run of instructions. The header comments that
// document the algorithms, registers and stack layout would have had to
// move or go, and no committed file could be reproduced byte for byte, so
// equivalence with the reviewed kernels would have rested on tests and
// interleaved benchmarks instead of identical bytes. It would also have
// added avo and its dependencies to go.mod (or a second module) for a
// generator that, with fixed registers, uses it as a typed text printer.
// This generator is plain Go with no dependencies; it builds on every
// platform (it only writes text), so it does not affect `go build ./...`
// or `go vet ./...` anywhere.
package main
