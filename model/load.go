package model

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/hub"
	"github.com/lmpack/lmpack/runtime"
)

// LoadOptions configures Load.
type LoadOptions struct {
	// Threads is the CPU worker count; <= 0 means all cores.
	Threads int
	// Hub configures resolution of hub ids; nil: HubOptions(Logger).
	Hub *hub.Options
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
	// ConvertPerBlock keeps the decoder blocks' float weights in the
	// checkpoint's dtype and converts one block at a time to float32
	// (runtime.LoadOptions.ConvertPerBlock).
	ConvertPerBlock bool
}

// Loaded is a checkpoint opened and loaded on the CPU backend: its
// directory, description, checkpoint (mapped; the weights' source),
// tokenizer and runtime model.
type Loaded struct {
	// Dir is the checkpoint directory (a hub id resolved to its snapshot).
	Dir string
	// Desc is config.json parsed (arch.Load).
	Desc *arch.Description
	// Checkpoint is the mapped safetensors weights; Model reads from it.
	Checkpoint *safetensors.Checkpoint
	// Tokenizer is the checkpoint's tokenizer (LoadTokenizer).
	Tokenizer *tokenizer.Tokenizer
	// Model is the model loaded on the CPU backend.
	Model runtime.Model
}

// Load resolves and opens model (Open), checks that the checkpoint holds
// no tensor config.json does not describe (CheckUnused), loads the
// tokenizer (LoadTokenizer) and loads the weights on the CPU backend
// (runtime.NewCPU) with opt.Threads workers. The caller closes the
// result. Errors: those of Open, CheckUnused, LoadTokenizer and the
// backend's Load (naming the tensor).
func Load(ctx context.Context, model string, opt LoadOptions) (*Loaded, error) {
	h := opt.Hub
	if h == nil {
		h = HubOptions(opt.Logger)
	}
	dir, d, ck, err := Open(ctx, model, h)
	if err != nil {
		return nil, err
	}
	if err := CheckUnused(dir, d, ck); err != nil {
		ck.Close()
		return nil, err
	}
	tok, err := LoadTokenizer(dir, d)
	if err != nil {
		ck.Close()
		return nil, err
	}
	t0 := time.Now()
	m, err := runtime.NewCPU().Load(ctx, d, ck, runtime.LoadOptions{Threads: opt.Threads, ConvertPerBlock: opt.ConvertPerBlock})
	if err != nil {
		ck.Close()
		return nil, err
	}
	if opt.Logger != nil {
		opt.Logger.Info("model loaded", "dir", dir, "architecture", d.Architecture, "layers", len(d.Layers), "device", "cpu", "seconds", time.Since(t0).Seconds())
	}
	return &Loaded{Dir: dir, Desc: d, Checkpoint: ck, Tokenizer: tok, Model: m}, nil
}

// Close releases the runtime model and unmaps the checkpoint. Errors:
// those of the checkpoint's Close.
func (l *Loaded) Close() error {
	l.Model.Close()
	return l.Checkpoint.Close()
}

// LoadTokenizer loads the tokenizer of the checkpoint directory dir
// (tokenizer.Load: tokenizer.json and tokenizer_config.json) and checks it
// against the model's description d. Errors: tokenizer.Load's, naming dir;
// a tokenizer with more tokens than d's vocab_size.
func LoadTokenizer(dir string, d *arch.Description) (*tokenizer.Tokenizer, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	if tok.VocabSize() > d.VocabSize {
		return nil, fmt.Errorf("model: %s: tokenizer has %d tokens but vocab_size is %d", dir, tok.VocabSize(), d.VocabSize)
	}
	return tok, nil
}
