package kernels

// The integer-dot-product assembly (qdot8_amd64.s, qdot8m_amd64.s,
// qdot8p_amd64.s, qdot8act_amd64.s) is generated; see internal/asmgen.
//go:generate go run ./internal/asmgen
