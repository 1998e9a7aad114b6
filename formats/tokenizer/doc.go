// Package tokenizer is a pure-Go implementation of Hugging Face
// tokenizer.json files whose model is BPE.
package tokenizer
