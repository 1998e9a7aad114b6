// Package serve is lmpack's OpenAI-compatible HTTP server on the bundled
// runtime: continuous batching of many requests through
// runtime.ForwardBatch, with every sequence's KV cache taken from a pool
// sized in bytes.
//
// This file is the contract between the scheduler (sched*.go) and the
// HTTP layer (api*.go).
package serve

import (
	"context"
	"errors"

	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Errors of Scheduler.Submit.
var (
	// ErrQueueFull: the wait queue is at its bound; HTTP 503 with
	// Retry-After.
	ErrQueueFull = errors.New("serve: request queue is full")
	// ErrNeverFits: the request's prompt + max_tokens (prompt + 1 token
	// when max_tokens is the default) needs more KV memory than the whole
	// pool; HTTP 400.
	ErrNeverFits = errors.New("serve: request can never fit in the KV memory budget")
	// ErrTooLong: prompt + max_tokens exceeds the max model length; HTTP 400.
	ErrTooLong = errors.New("serve: request exceeds the max model length")
	// ErrShuttingDown: the server no longer admits requests; HTTP 503.
	ErrShuttingDown = errors.New("serve: server is shutting down")
)

// GenRequest is one generation request, already tokenized and validated by
// the HTTP layer.
type GenRequest struct {
	// ID names the request in logs and metrics ("cmpl-…", "chatcmpl-…").
	ID string
	// Prompt holds token ids (BOS included when the tokenizer adds it);
	// at least one.
	Prompt []int
	// MaxTokens is the most tokens generated, > 0.
	MaxTokens int
	// DefaultMaxTokens: the client gave no max_tokens (MaxTokens is the
	// server's default, e.g. what the context leaves). Such a request is
	// refused with ErrNeverFits only when its prompt + 1 token cannot fit
	// the whole KV budget; it finishes "length" when it has the whole
	// pool to itself and the pool cannot hold its next token.
	DefaultMaxTokens bool
	// Temperature 0 is greedy (argmax, ties to the lowest id); TopP in
	// (0, 1] (0 or 1: all); TopK > 0 keeps the K most likely (0: all).
	Temperature, TopP float64
	TopK              int
	// Seed seeds the request's own sampler, so its output does not depend
	// on other requests.
	Seed uint64
	// StopTokenIDs end generation with finish "stop" when sampled (the id
	// is not emitted); EOS ids of the model do so too unless IgnoreEOS.
	StopTokenIDs []int
	IgnoreEOS    bool
	// Stop strings end generation with finish "stop" at the step whose
	// token completes one of them in the text StopDecoder decodes (that
	// token is emitted; the HTTP layer trims the text at the stop
	// string). StopDecoder decodes the generated tokens incrementally (a
	// tokenizer.StreamDecoder after the prompt, used by the scheduler
	// only); required when Stop is not empty.
	Stop        []string
	StopDecoder *tokenizer.StreamDecoder
	// TopLogprobs < 0: no logprobs; otherwise every Event carries the
	// sampled token's log-probability and the TopLogprobs most likely
	// alternatives (log-softmax of the raw logits, before temperature).
	TopLogprobs int
}

// TokenLogprob is a token id and its natural-log probability.
type TokenLogprob struct {
	ID      int
	Logprob float32
}

// Event is one generated token, or the end of a request (Finish != "").
type Event struct {
	// Token is the sampled id (valid when Finish == "").
	Token   int
	Logprob float32
	Top     []TokenLogprob
	// Finish is "" for a token, else "stop" (EOS or a stop token id),
	// "length" (MaxTokens reached), "cancelled" (the request's context
	// ended) or "error" (Err says why).
	Finish string
	Err    error
}

// Submitter is what the HTTP layer needs from the scheduler.
type Submitter interface {
	// Submit queues r and returns the channel its events arrive on; the
	// last event has Finish set and the channel is closed after it.
	// Cancelling ctx (client gone, stop string found) frees the request's
	// KV blocks within one scheduler step. Errors: ErrQueueFull,
	// ErrNeverFits, ErrTooLong, ErrShuttingDown.
	Submit(ctx context.Context, r *GenRequest) (<-chan Event, error)
}

// RejectCounter is the optional ability of a Submitter to count a
// generation request that the HTTP layer refused before Submit (a 400 for
// a prompt beyond the context or a malformed field, a 503 while draining)
// under its lmpack_requests_rejected_total reasons: too_long, invalid,
// shutting_down. Scheduler implements it.
type RejectCounter interface {
	CountRejected(reason string)
}

// KVPool is the scheduler's KV memory: a budget in bytes handed out in
// blocks of tokens (runtime/kvcache.Pool implements it).
type KVPool interface {
	// BytesFor is the budget a sequence of capacity tokens reserves: its
	// blocks (codes, scales, norms) plus its fixed bytes (fp16 sink and
	// recent windows), in bytes.
	BytesFor(capacity int) int64
	// BytesForReserve is the budget a sequence of capacity tokens
	// reserves while it holds blocks for its first tokens tokens only
	// (its fixed bytes plus those blocks); BytesForReserve(c, c) =
	// BytesFor(c).
	BytesForReserve(capacity, tokens int) int64
	// NewCache reserves BytesFor(capacity) and returns an empty cache of
	// that capacity whose storage is taken from the pool in blocks.
	// Errors: wraps kvcache.ErrPoolFull when the free budget is too small
	// now, kvcache.ErrNeverFits when capacity exceeds the whole budget.
	NewCache(capacity int) (runtime.KVCache, error)
	// NewCacheReserve is NewCache reserving BytesForReserve(capacity,
	// tokens) only (allocation on demand); the cache may store its first
	// tokens tokens until Grow raises the reservation. Errors as NewCache.
	NewCacheReserve(capacity, tokens int) (runtime.KVCache, error)
	// Grow raises c's reservation to its first tokens tokens (never
	// lowers it). Errors: wraps kvcache.ErrPoolFull when the free budget
	// cannot hold the difference now (the reservation is unchanged).
	Grow(c runtime.KVCache, tokens int) error
	// Release returns every block and byte of c (from NewCache) to the
	// pool; c must not be used afterwards.
	Release(c runtime.KVCache)
	// Stats reports the pool's use now.
	Stats() PoolStats
}

// PoolStats is a KVPool's use (fields documented at kvcache.PoolStats).
type PoolStats = kvcache.PoolStats
