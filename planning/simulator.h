#pragma once
// A discrete-event model of a Tandem deployment serving a workload (docs/planning.md): it turns
// device profiles, a layout (prefill and decode workers, or aggregated replicas) and a request
// stream into every request's TTFT and TPOT, so percentiles and SLO attainment come from
// distributions, not averages.
//
// Model:
// - Arrivals are Poisson at `rate`; each request's (input, output) lengths are drawn from the
//   workload's samples. The stream depends only on the seed: every layout and rate sees the same
//   requests, arrival gaps scaled by 1/rate (common random numbers), so comparisons are fair and
//   goodput searches smooth.
// - The router sends a request to the decode worker with the fewest sequences, which reserves
//   its KV (input + output) in FIFO order as capacity frees up; only then is the prompt sent to
//   the prefill worker with the least work queued (Tandem's two-phase admission).
// - A prefill worker is a FIFO queue served in engine steps: each step takes the waiting prompts
//   in order up to prefill_max_num_batched_tokens tokens and max_num_seqs prompts (chunking the
//   long ones) and lasts the step's fixed cost plus each chunk's own (attention is per
//   sequence: PrefillMs(chunk, computed before it) less the fixed cost), the chunks' sum scaled
//   by the profile's batching efficiency for that many (PrefillBatchEfficiency). A prompt is done
//   at the end of the step holding its last chunk (with one prompt per step and fixed lengths, this
//   is DistServe's M/D/1 queue).
// - The KV then moves to the decode worker, taking TransferMs(input); the first token (sampled
//   on the prefill worker) is out when the KV lands: TTFT.
// - A decode worker runs continuous batching: a step decodes one token for each running
//   sequence and lasts DecodeStepMs(batch, mean context). A landed sequence joins at the next
//   step while fewer than max_num_seqs run, else waits in FIFO order.
//   TPOT = (last token - first token) / (output - 1).
// - An aggregated replica does both in one engine: each step decodes its running sequences and
//   fills the rest of the token budget with prompt chunks (FIFO, KV reserved at admission),
//   lasting DecodeStepMs(batch, context) plus the prompt chunks' cost as above. A prompt's first
//   token comes at the end of the step that finishes it.
// - Every step also lasts its profile's calibrated cost beyond the forward pass
//   (DecodeCalibration::step_overhead_ms, and PrefillCalibration's for prefill workers when
//   calibrated: scheduling, sampling, output, the gap between engine iterations), which bare
//   forward passes do not see.
// The first `warmup_fraction` of requests (by arrival) are left out of the statistics.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <utility>
#include <vector>

#include "planning/profile.h"

namespace tandem::planning {

struct Workload {
  std::vector<std::pair<int, int>> requests;  // (input tokens, output tokens) samples, >= 1 each
  double rate = 1.0;                          // requests per second
};

struct Layout {
  int prefill = 0;     // prefill workers (disaggregated)
  int decode = 0;      // decode workers (disaggregated)
  int aggregated = 0;  // replicas doing both (then prefill = decode = 0)
  int devices() const { return prefill + decode + aggregated; }
  bool disaggregated() const { return aggregated == 0; }
};

struct EngineLimits {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;           // decode workers and aggregated replicas
  int prefill_max_num_batched_tokens = 8192;  // prefill workers (their default)
};

struct SimOptions {
  int num_requests = 2000;
  double warmup_fraction = 0.1;
  uint64_t seed = 1;
};

struct RequestOutcome {
  double ttft_ms = 0;
  double tpot_ms = 0;  // 0 for a one-token output
  int input = 0, output = 0;
};

struct SimResult {
  std::vector<RequestOutcome> requests;  // after warm-up, in arrival order
  double duration_s = 0;                 // first arrival to last completion
};

// `prefill` profiles the prefill workers (and aggregated replicas), `decode` the decode workers.
SimResult Simulate(const DeviceProfile& prefill, const DeviceProfile& decode, const Layout& layout,
                   const Workload& workload, const EngineLimits& limits,
                   const SimOptions& options = {});

// The p-th percentile (0..100) by nearest rank; 0 for no values.
double Percentile(std::vector<double> values, double p);

}  // namespace tandem::planning
