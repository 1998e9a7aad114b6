// Package compress is the `lmpack compress` batch job: one recipe (YAML)
// drives the stages calibrate → prune-layers → prune-width →
// quantize-weights → quantize-kv → pack → eval over a checkpoint and
// yields one verified .lmpk artifact and a JSON report.
//
// Order of the quantization stages: weights first (quantize/wquant, RTN or
// GPTQ, on the calibration of the current model), then the KV cache. A
// stage that changes the model (prune-layers, prune-width,
// quantize-weights) invalidates the calibration, so the next stage that
// needs one calibrates the changed model itself: prune-width scores head
// groups and refits FFNs on the layer-pruned model, and the OSCAR
// rotations and clip ratios are fitted to the keys and values of the
// quantized model, which is the model the artifact runs.
//
// Each stage writes its outputs into a work directory, in a private
// temporary directory renamed into place only after its completion marker
// (done.json) is written, under a cache key that fingerprints the source
// model (model.Fingerprint), the data files (sha256), the lmpack
// version and the recipe up to and including that stage. A rerun reuses
// every finished stage whose key is unchanged: a killed job resumes at the
// stage it was in, and a changed recipe section recomputes that stage and
// the later ones only. A finished stage is reused only after its outputs
// pass a check (an artifact pack.Verify, a model directory
// model.Check, calibration and rotation files open); one that
// fails is logged, recomputed, and every later stage with it.
//
// The work directory holds only the stage directories, their
// temporaries, a lock file (one compress at a time) and the marker file
// lmpack-work-dir; a run removes the temporaries of stages that a killed
// run left, and nothing else. A non-empty directory without the marker
// that holds anything else is refused as work directory.
//
// The stages call the packages that do the work (calibrate, prune,
// quantize/wquant, quantize/oscar, pack, eval); this package only plans, caches and
// reports. Adding a stage means one recipe section, one entry in
// Pipeline.stages and in stageNames, and its run function. It is not a
// scheduler: stages run one after the other in this process.
package compress
