#include "planning/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <random>
#include <tuple>

namespace tandem::planning {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Request {
  double arrival = 0;  // ms
  int input = 0, output = 0;
  int prefill_left = 0;
  double first_token = kInf, last_token = kInf;
  int generated = 0;  // tokens after the first
  int decode_worker = -1;
  bool done = false;
};

enum class Event { kArrival, kPrefillStepEnd, kKvLanded, kDecodeStepEnd, kReplicaStepEnd };

struct Queued {
  double time;
  uint64_t order;  // FIFO among equal times
  Event event;
  int index;
  bool operator>(const Queued& o) const {
    return std::tie(time, order) > std::tie(o.time, o.order);
  }
};

struct PrefillWorker {
  std::deque<int> fifo;
  std::vector<std::pair<int, int>> step;  // (request, tokens) of the running step
  bool busy = false;
  int64_t queued_tokens = 0;
};

struct DecodeWorker {
  std::deque<int> reserving;  // waiting for KV blocks (before their prefill starts)
  int reserved = 0;           // holding blocks, KV not landed yet
  std::deque<int> waiting;    // KV landed, waiting for a batch slot
  std::vector<int> running;
  bool busy = false;
  int64_t kv_used = 0;  // reserved, waiting and running sequences' whole lengths
};

struct Replica {
  std::deque<int> waiting;      // not admitted yet
  std::vector<int> prefilling;  // admitted, prompt not done
  std::vector<int> running;     // decoding
  std::vector<std::pair<int, int>> step_prefill;
  std::vector<int> step_decode;
  bool busy = false;
  int64_t kv_used = 0;
  int64_t queued_tokens = 0;
};

class Sim {
 public:
  Sim(const DeviceProfile& prefill, const DeviceProfile& decode, const Layout& layout,
      const Workload& workload, const EngineLimits& limits, const SimOptions& options)
      : pp_(prefill), dp_(decode), layout_(layout), limits_(limits) {
    std::mt19937_64 rng(options.seed);
    std::exponential_distribution<double> gap(1.0);
    std::uniform_int_distribution<size_t> pick(0, workload.requests.size() - 1);
    double t = 0;
    reqs_.resize(static_cast<size_t>(options.num_requests));
    for (Request& r : reqs_) {
      t += gap(rng) * 1000.0 / workload.rate;
      const auto [in, out] = workload.requests[pick(rng)];
      r.arrival = t;
      r.input = in;
      r.output = out;
      r.prefill_left = in;
    }
    prefill_.resize(static_cast<size_t>(layout.prefill));
    decode_.resize(static_cast<size_t>(layout.decode));
    replicas_.resize(static_cast<size_t>(layout.aggregated));
  }

  SimResult Run(double warmup_fraction) {
    for (size_t i = 0; i < reqs_.size(); ++i)
      Push(reqs_[i].arrival, Event::kArrival, static_cast<int>(i));
    double last = 0;
    while (!events_.empty()) {
      const Queued e = events_.top();
      events_.pop();
      now_ = e.time;
      last = std::max(last, now_);
      switch (e.event) {
        case Event::kArrival:
          Arrive(e.index);
          break;
        case Event::kPrefillStepEnd:
          PrefillStepEnd(e.index);
          break;
        case Event::kKvLanded:
          KvLanded(e.index);
          break;
        case Event::kDecodeStepEnd:
          DecodeStepEnd(e.index);
          break;
        case Event::kReplicaStepEnd:
          ReplicaStepEnd(e.index);
          break;
      }
    }
    SimResult result;
    const size_t skip = static_cast<size_t>(warmup_fraction * static_cast<double>(reqs_.size()));
    for (size_t i = skip; i < reqs_.size(); ++i) {
      const Request& r = reqs_[i];
      RequestOutcome o;
      o.input = r.input;
      o.output = r.output;
      o.ttft_ms = r.done || r.first_token < kInf ? r.first_token - r.arrival : kInf;
      o.tpot_ms = !r.done        ? kInf
                  : r.output > 1 ? (r.last_token - r.first_token) / (r.output - 1)
                                 : 0;
      result.requests.push_back(o);
    }
    result.duration_s = reqs_.empty() ? 0 : (last - reqs_.front().arrival) / 1000.0;
    return result;
  }

 private:
  void Push(double t, Event e, int index) { events_.push({t, order_++, e, index}); }

  // A request whose whole KV can never fit a worker fails (infinite TTFT) instead of waiting.
  bool Fits(const Request& r, const DeviceProfile& p) const {
    return r.input + r.output <= p.kv_capacity_tokens;
  }

  void Arrive(int i) {
    Request& r = reqs_[i];
    if (layout_.disaggregated()) {
      if (!Fits(r, dp_)) return;
      // The decode worker first (fewest sequences), which reserves the KV before any prefill.
      size_t w = 0;
      const auto load = [&](const DecodeWorker& d) {
        return d.reserving.size() + static_cast<size_t>(d.reserved) + d.waiting.size() +
               d.running.size();
      };
      for (size_t k = 1; k < decode_.size(); ++k) {
        if (load(decode_[k]) < load(decode_[w])) w = k;
      }
      r.decode_worker = static_cast<int>(w);
      decode_[w].reserving.push_back(i);
      Reserve(static_cast<int>(w));
    } else {
      if (!Fits(r, pp_)) return;
      size_t w = 0;
      const auto load = [&](const Replica& x) {
        return x.queued_tokens + static_cast<int64_t>(x.running.size());
      };
      for (size_t k = 1; k < replicas_.size(); ++k) {
        if (load(replicas_[k]) < load(replicas_[w])) w = k;
      }
      replicas_[w].waiting.push_back(i);
      replicas_[w].queued_tokens += r.input;
      if (!replicas_[w].busy) StartReplicaStep(static_cast<int>(w));
    }
  }

  // Decode worker `w` reserves KV for its waiting requests in FIFO order and sends each to the
  // prefill worker with the least work queued.
  void Reserve(int w) {
    DecodeWorker& d = decode_[w];
    while (!d.reserving.empty()) {
      const int i = d.reserving.front();
      const Request& r = reqs_[i];
      if (d.kv_used + r.input + r.output > dp_.kv_capacity_tokens) break;
      d.kv_used += r.input + r.output;
      ++d.reserved;
      d.reserving.pop_front();
      size_t p = 0;
      for (size_t k = 1; k < prefill_.size(); ++k) {
        if (prefill_[k].queued_tokens < prefill_[p].queued_tokens) p = k;
      }
      prefill_[p].fifo.push_back(i);
      prefill_[p].queued_tokens += r.input;
      if (!prefill_[p].busy) StartPrefillStep(static_cast<int>(p));
    }
  }

  // The prompt chunks of one step, (request, tokens) each: the step's fixed cost once, plus each
  // chunk's share (its prompt's cost beyond the positions computed before it: attention is per
  // sequence, so two 512-token prompts cost twice one, not one 1,024-token prompt).
  double StepPrefillMs(const std::vector<std::pair<int, int>>& chunks) const {
    const double fixed = pp_.PrefillFixedMs();
    double sum = 0;
    for (const auto& [i, n] : chunks) {
      const int done = reqs_[i].input - reqs_[i].prefill_left;
      sum += std::max(0.0, pp_.PrefillMs(n, done) - fixed);
    }
    // Several prompts in one step share its wider GEMMs (DeviceProfile::PrefillBatchEfficiency).
    return fixed + pp_.PrefillBatchEfficiency(static_cast<double>(chunks.size())) * sum;
  }

  void StartPrefillStep(int w) {
    PrefillWorker& pw = prefill_[w];
    pw.step.clear();
    int budget = limits_.prefill_max_num_batched_tokens;
    int seqs = 0;
    for (int i : pw.fifo) {
      if (budget == 0 || seqs == limits_.max_num_seqs) break;
      const int n = std::min(budget, reqs_[i].prefill_left);
      pw.step.push_back({i, n});
      budget -= n;
      ++seqs;
    }
    if (pw.step.empty()) {
      pw.busy = false;
      return;
    }
    pw.busy = true;
    // A prefill worker's cost beyond the forward pass: its own calibration's when it has one.
    const double overhead = pp_.prefill_calibration.steps > 0
                                ? pp_.prefill_calibration.step_overhead_ms
                                : pp_.calibration.step_overhead_ms;
    Push(now_ + StepPrefillMs(pw.step) + overhead, Event::kPrefillStepEnd, w);
  }

  void PrefillStepEnd(int w) {
    PrefillWorker& pw = prefill_[w];
    for (const auto& [i, n] : pw.step) {
      Request& r = reqs_[i];
      r.prefill_left -= n;
      pw.queued_tokens -= n;
      if (r.prefill_left == 0) {
        pw.fifo.erase(std::find(pw.fifo.begin(), pw.fifo.end(), i));
        Push(now_ + dp_.TransferMs(r.input), Event::kKvLanded, i);
      }
    }
    StartPrefillStep(w);
  }

  void KvLanded(int i) {
    Request& r = reqs_[i];
    DecodeWorker& d = decode_[r.decode_worker];
    --d.reserved;
    r.first_token = r.last_token = now_;
    if (r.output <= 1) {
      r.done = true;
      d.kv_used -= r.input + r.output;
      Reserve(r.decode_worker);
      return;
    }
    d.waiting.push_back(i);
    if (!d.busy) StartDecodeStep(r.decode_worker);
  }

  void StartDecodeStep(int w) {
    DecodeWorker& d = decode_[w];
    while (!d.waiting.empty() && static_cast<int>(d.running.size()) < limits_.max_num_seqs) {
      d.running.push_back(d.waiting.front());
      d.waiting.pop_front();
    }
    if (d.running.empty()) {
      d.busy = false;
      return;
    }
    d.busy = true;
    Push(now_ + dp_.DecodeStepMs(static_cast<int>(d.running.size()), MeanContext(d.running)) +
             dp_.calibration.step_overhead_ms,
         Event::kDecodeStepEnd, w);
  }

  int MeanContext(const std::vector<int>& seqs) const {
    if (seqs.empty()) return 0;
    int64_t sum = 0;
    for (int i : seqs) sum += reqs_[i].input + reqs_[i].generated;
    return static_cast<int>(sum / static_cast<int64_t>(seqs.size()));
  }

  // One more token for `i`; true when it finished.
  bool Advance(int i) {
    Request& r = reqs_[i];
    ++r.generated;
    r.last_token = now_;
    if (r.generated + 1 >= r.output) {
      r.done = true;
      return true;
    }
    return false;
  }

  void DecodeStepEnd(int w) {
    DecodeWorker& d = decode_[w];
    std::vector<int> still;
    for (int i : d.running) {
      if (Advance(i)) {
        d.kv_used -= reqs_[i].input + reqs_[i].output;
      } else {
        still.push_back(i);
      }
    }
    d.running = std::move(still);
    Reserve(w);
    StartDecodeStep(w);
  }

  void StartReplicaStep(int w) {
    Replica& x = replicas_[w];
    while (!x.waiting.empty() &&
           static_cast<int>(x.running.size() + x.prefilling.size()) < limits_.max_num_seqs) {
      const Request& r = reqs_[x.waiting.front()];
      if (x.kv_used + r.input + r.output > pp_.kv_capacity_tokens) break;
      x.kv_used += r.input + r.output;
      x.prefilling.push_back(x.waiting.front());
      x.waiting.pop_front();
    }
    x.step_decode = x.running;
    x.step_prefill.clear();
    int budget = std::max(0, limits_.max_num_batched_tokens - static_cast<int>(x.running.size()));
    for (int i : x.prefilling) {
      if (budget == 0) break;
      const int n = std::min(budget, reqs_[i].prefill_left);
      x.step_prefill.push_back({i, n});
      budget -= n;
    }
    if (x.step_decode.empty() && x.step_prefill.empty()) {
      x.busy = false;
      return;
    }
    x.busy = true;
    int prompt_tokens = 0;
    for (const auto& [i, n] : x.step_prefill) prompt_tokens += n;
    double ms = pp_.calibration.step_overhead_ms;  // the engine's host work, once a step
    if (!x.step_decode.empty()) {
      ms += pp_.DecodeStepMs(static_cast<int>(x.step_decode.size()), MeanContext(x.step_decode));
    }
    if (prompt_tokens > 0) ms += StepPrefillMs(x.step_prefill);
    Push(now_ + ms, Event::kReplicaStepEnd, w);
  }

  void ReplicaStepEnd(int w) {
    Replica& x = replicas_[w];
    std::vector<int> still;
    for (int i : x.step_decode) {
      if (Advance(i)) {
        x.kv_used -= reqs_[i].input + reqs_[i].output;
      } else {
        still.push_back(i);
      }
    }
    for (const auto& [i, n] : x.step_prefill) {
      Request& r = reqs_[i];
      r.prefill_left -= n;
      x.queued_tokens -= n;
      if (r.prefill_left > 0) continue;
      x.prefilling.erase(std::find(x.prefilling.begin(), x.prefilling.end(), i));
      r.first_token = r.last_token = now_;
      if (r.output <= 1) {
        r.done = true;
        x.kv_used -= r.input + r.output;
      } else {
        still.push_back(i);
      }
    }
    x.running = std::move(still);
    StartReplicaStep(w);
  }

  const DeviceProfile& pp_;
  const DeviceProfile& dp_;
  const Layout layout_;
  const EngineLimits limits_;
  std::vector<Request> reqs_;
  std::vector<PrefillWorker> prefill_;
  std::vector<DecodeWorker> decode_;
  std::vector<Replica> replicas_;
  std::priority_queue<Queued, std::vector<Queued>, std::greater<Queued>> events_;
  uint64_t order_ = 0;
  double now_ = 0;
};

}  // namespace

SimResult Simulate(const DeviceProfile& prefill, const DeviceProfile& decode, const Layout& layout,
                   const Workload& workload, const EngineLimits& limits,
                   const SimOptions& options) {
  if (workload.requests.empty() || workload.rate <= 0 || layout.devices() == 0 ||
      (layout.disaggregated() && (layout.prefill == 0 || layout.decode == 0))) {
    return {};
  }
  Sim sim(prefill, decode, layout, workload, limits, options);
  return sim.Run(options.warmup_fraction);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t index =
      static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(values.size()))) - 1;
  return values[index];
}

}  // namespace tandem::planning
