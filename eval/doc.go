// Package eval measures a model's quality on text: perplexity over
// non-overlapping windows (this file), and, as later stages land,
// side-by-side comparisons of a compressed model against its original.
//
// It works on token ids and a runtime.Model; reading files and tokenizing
// happen at the edges (internal/engine and cmd).
package eval
