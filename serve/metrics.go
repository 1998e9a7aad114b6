package serve

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Finish reasons of Event.Finish, the label values of
// lmpack_requests_finished_total.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishCancelled = "cancelled"
	FinishError     = "error"
)

// schedMetrics are the scheduler's Prometheus metrics (names lmpack_*).
// The gauges are set by the step loop after every step (never read from
// the pool at scrape time: the pool is the loop's).
type schedMetrics struct {
	queueDepth, running          prometheus.Gauge
	blocksUsed, blocksFree       prometheus.Gauge
	bytesUsed, bytesTotal        prometheus.Gauge
	promptTokens, genTokens      prometheus.Counter
	ttft, itl                    prometheus.Histogram
	finished, rejected           *prometheus.CounterVec
	steps                        prometheus.Counter
	stepTokens                   prometheus.Histogram
	forwardErrors, requestPanics prometheus.Counter
	preemptions                  prometheus.Counter
}

// latencyBuckets are the latency histograms' upper bounds in seconds,
// doubling from 0.1 ms to about 52 s (a decode step of the small test
// models takes well under 1 ms; vLLM's buckets reach a similar top).
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 20)

// newSchedMetrics creates the metrics and registers them on reg. Errors:
// a name already registered on reg.
func newSchedMetrics(reg prometheus.Registerer) (*schedMetrics, error) {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &schedMetrics{
		queueDepth:   g("lmpack_queue_depth", "Requests waiting for admission (not yet holding KV memory)."),
		running:      g("lmpack_running_sequences", "Sequences admitted to the running batch (holding KV memory)."),
		blocksUsed:   g("lmpack_kv_blocks_used", "KV pool blocks in use."),
		blocksFree:   g("lmpack_kv_blocks_free", "KV pool blocks free."),
		bytesUsed:    g("lmpack_kv_bytes_used", "KV pool bytes reserved by admitted sequences."),
		bytesTotal:   g("lmpack_kv_bytes_total", "KV pool budget in bytes (--kv-memory)."),
		promptTokens: c("lmpack_prompt_tokens_total", "Prompt tokens prefilled."),
		genTokens:    c("lmpack_generation_tokens_total", "Tokens sampled (the stop token included)."),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lmpack_time_to_first_token_seconds", Help: "Time from Submit to the first sampled token, in seconds.",
			Buckets: latencyBuckets}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lmpack_inter_token_latency_seconds", Help: "Time between two sampled tokens of one request, in seconds.",
			Buckets: latencyBuckets}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lmpack_requests_finished_total", Help: "Requests finished, by finish reason (stop, length, cancelled, error)."},
			[]string{"finish"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lmpack_requests_rejected_total", Help: "Generation requests refused before they ran, by reason (queue_full, never_fits, too_long, shutting_down, invalid): the scheduler's refusals and the HTTP layer's 400s and 503s (400 context_length_exceeded counts as too_long, any other 400 as invalid, a 503 while draining as shutting_down); other refusals (401, 404, 408, 413, 415) are counted by status in lmpack_http_requests_total only."},
			[]string{"reason"}),
		steps: c("lmpack_scheduler_steps_total", "Scheduler steps (batched forward calls)."),
		stepTokens: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lmpack_step_tokens", Help: "Tokens (prefill chunk rows plus decode rows) of one batched forward call.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13)}),
		forwardErrors: c("lmpack_forward_errors_total", "Batched forward calls that failed (their requests finish with error)."),
		requestPanics: c("lmpack_request_panics_total", "Panics recovered while handling one request (it finishes with error)."),
		preemptions:   c("lmpack_preemptions_total", "Running sequences preempted because the KV pool could not grow them (their cache released, recomputed on re-admission)."),
	}
	for _, f := range []string{FinishStop, FinishLength, FinishCancelled, FinishError} {
		m.finished.WithLabelValues(f)
	}
	for _, r := range []string{"queue_full", "never_fits", "too_long", "shutting_down", "invalid"} {
		m.rejected.WithLabelValues(r)
	}
	for _, col := range []prometheus.Collector{m.queueDepth, m.running, m.blocksUsed, m.blocksFree, m.bytesUsed, m.bytesTotal,
		m.promptTokens, m.genTokens, m.ttft, m.itl, m.finished, m.rejected, m.steps, m.stepTokens, m.forwardErrors, m.requestPanics, m.preemptions} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("serve: registering the scheduler's metrics: %w", err)
		}
	}
	return m, nil
}

// setPool sets the KV gauges from st.
func (m *schedMetrics) setPool(st PoolStats) {
	m.blocksUsed.Set(float64(st.UsedBlocks))
	m.blocksFree.Set(float64(st.TotalBlocks - st.UsedBlocks))
	m.bytesUsed.Set(float64(st.UsedBytes))
	m.bytesTotal.Set(float64(st.TotalBytes))
}
