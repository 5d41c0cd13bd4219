#include "planning/profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::planning {
namespace {

using json = nlohmann::json;

// Linear through the segment around x (the first or last segment outside the points), never
// below the smallest y. xs sorted ascending, distinct; at least one point.
double Lerp(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  const double floor = *std::min_element(ys.begin(), ys.end());
  if (xs.size() == 1) return ys[0];
  size_t i = std::upper_bound(xs.begin(), xs.end(), x) - xs.begin();
  i = std::clamp<size_t>(i, 1, xs.size() - 1);
  const double t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
  return std::max(floor, ys[i - 1] + t * (ys[i] - ys[i - 1]));
}

absl::Status Bad(const std::string& where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("profile: ", where, ": ", what));
}

absl::Status OnlyKeys(const json& j, const std::string& where, std::set<std::string> keys) {
  if (!j.is_object()) return Bad(where, "must be an object");
  for (const auto& [k, v] : j.items()) {
    if (!keys.contains(k)) return Bad(where, absl::StrCat("unknown field '", k, "'"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GetInt(const json& j, const std::string& where, const char* key, T lo, T hi, T* out) {
  const auto it = j.find(key);
  if (it == j.end()) return Bad(where, absl::StrCat("'", key, "' is missing"));
  if (!it->is_number_integer()) return Bad(where, absl::StrCat("'", key, "' must be an integer"));
  const int64_t v = it->get<int64_t>();
  if (v < static_cast<int64_t>(lo) || v > static_cast<int64_t>(hi)) {
    return Bad(where, absl::StrCat("'", key, "' is ", v, ", outside [", lo, ", ", hi, "]"));
  }
  *out = static_cast<T>(v);
  return absl::OkStatus();
}

absl::Status GetMs(const json& j, const std::string& where, double* out) {
  const auto it = j.find("ms");
  if (it == j.end() || !it->is_number()) return Bad(where, "'ms' must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v <= 0 || v > 3.6e6) {
    return Bad(where, "'ms' must be finite, > 0 and at most an hour");
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status GetString(const json& j, const char* key, bool required, std::string* out) {
  const auto it = j.find(key);
  if (it == j.end())
    return required ? Bad("top level", absl::StrCat("'", key, "' is missing")) : absl::OkStatus();
  if (!it->is_string() || it->get<std::string>().size() > 256) {
    return Bad("top level", absl::StrCat("'", key, "' must be a string of at most 256 bytes"));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

constexpr int kMaxTokens = 1 << 22;
constexpr size_t kMaxPoints = 4096;

absl::Status GetPositive(const json& j, const char* where, const char* key, double hi,
                         double* out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    return Bad(where, absl::StrCat("'", key, "' must be a number"));
  }
  const double v = it->get<double>();
  if (!std::isfinite(v) || v <= 0 || v > hi) {
    return Bad(where, absl::StrCat("'", key, "' is ", v, ", outside (0, ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

// A number in [0, hi]; absent is 0 unless `required` (fields added after profiles were written
// are optional).
absl::Status GetNonNegative(const json& j, const char* where, const char* key, double hi,
                            bool required, double* out) {
  const auto it = j.find(key);
  if (it == j.end() && !required) return absl::OkStatus();
  if (it == j.end() || !it->is_number() || !std::isfinite(it->get<double>()) ||
      it->get<double>() < 0 || it->get<double>() > hi) {
    return Bad(where, absl::StrCat("'", key, "' must be a number in [0, ", hi, "]"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status GetDate(const json& j, const char* where, std::string* out) {
  const auto date = j.find("date");
  if (date == j.end() || !date->is_string() || date->get<std::string>().size() > 256) {
    return Bad(where, "'date' must be a string of at most 256 bytes");
  }
  *out = date->get<std::string>();
  return absl::OkStatus();
}

// The widest factor `tandem profile calibrate --max-factor` allows.
constexpr double kMaxFactor = 1000;
constexpr double kMaxMs = 3.6e6;

absl::Status ParseCalibration(const json& j, DecodeCalibration* c) {
  constexpr const char* kWhere = "calibration";
  if (absl::Status s = OnlyKeys(
          j, kWhere,
          {"factor", "penalty_ms", "served_step_ms", "served_interval_ms", "profiled_step_ms",
           "batch", "context", "step_overhead_ms", "gap_ms", "steps", "workers", "date"});
      !s.ok()) {
    return s;
  }
  for (auto [key, hi, out] :
       {std::tuple<const char*, double, double*>{"factor", kMaxFactor, &c->factor},
        {"served_step_ms", kMaxMs, &c->served_step_ms},
        {"profiled_step_ms", kMaxMs, &c->profiled_step_ms},
        {"batch", 1 << 16, &c->batch}}) {
    if (absl::Status s = GetPositive(j, kWhere, key, hi, out); !s.ok()) return s;
  }
  // Optional ones: profiles calibrated before they were measured have none (0).
  for (auto [key, hi, required, out] :
       {std::tuple<const char*, double, bool, double*>{"context", kMaxTokens, true, &c->context},
        {"served_interval_ms", kMaxMs, false, &c->served_interval_ms},
        {"step_overhead_ms", kMaxMs, false, &c->step_overhead_ms},
        {"gap_ms", kMaxMs, false, &c->gap_ms}}) {
    if (absl::Status s = GetNonNegative(j, kWhere, key, hi, required, out); !s.ok()) return s;
  }
  // Optional, and the one field that may be negative.
  if (const auto penalty = j.find("penalty_ms"); penalty != j.end()) {
    if (!penalty->is_number() || !std::isfinite(penalty->get<double>()) ||
        std::abs(penalty->get<double>()) > kMaxMs) {
      return Bad(kWhere, "'penalty_ms' must be a number in [-3600000, 3600000]");
    }
    c->penalty_ms = penalty->get<double>();
  }
  if (absl::Status s = GetInt<int64_t>(j, kWhere, "steps", 1, int64_t{1} << 50, &c->steps);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = GetInt(j, kWhere, "workers", 1, 1 << 16, &c->workers); !s.ok()) return s;
  return GetDate(j, kWhere, &c->date);
}

absl::Status ParsePrefillCalibration(const json& j, PrefillCalibration* c) {
  constexpr const char* kWhere = "prefill_calibration";
  if (absl::Status s = OnlyKeys(
          j, kWhere,
          {"factor", "served_step_ms", "profiled_step_ms", "chunks_per_step", "chunk_tokens",
           "cached_tokens", "step_overhead_ms", "steps", "workers", "date"});
      !s.ok()) {
    return s;
  }
  for (auto [key, hi, out] :
       {std::tuple<const char*, double, double*>{"factor", kMaxFactor, &c->factor},
        {"served_step_ms", kMaxMs, &c->served_step_ms},
        {"profiled_step_ms", kMaxMs, &c->profiled_step_ms},
        {"chunks_per_step", 1 << 16, &c->chunks_per_step},
        {"chunk_tokens", kMaxTokens, &c->chunk_tokens}}) {
    if (absl::Status s = GetPositive(j, kWhere, key, hi, out); !s.ok()) return s;
  }
  for (auto [key, hi, out] :
       {std::tuple<const char*, double, double*>{"cached_tokens", kMaxTokens, &c->cached_tokens},
        {"step_overhead_ms", kMaxMs, &c->step_overhead_ms}}) {
    if (absl::Status s = GetNonNegative(j, kWhere, key, hi, true, out); !s.ok()) return s;
  }
  if (absl::Status s = GetInt<int64_t>(j, kWhere, "steps", 1, int64_t{1} << 50, &c->steps);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = GetInt(j, kWhere, "workers", 1, 1 << 16, &c->workers); !s.ok()) return s;
  return GetDate(j, kWhere, &c->date);
}

}  // namespace

namespace {

// The uncached prefill points as (tokens, ms) columns.
void UncachedPrefill(const std::vector<PrefillPoint>& prefill, std::vector<double>* xs,
                     std::vector<double>* ys) {
  for (const PrefillPoint& p : prefill) {
    if (p.cached_tokens != 0) continue;
    xs->push_back(p.tokens);
    ys->push_back(p.ms);
  }
}

}  // namespace

double DeviceProfile::PrefillFixedMs() const {
  return prefill_calibration.factor * MeasuredPrefillFixedMs();
}

double DeviceProfile::PrefillMs(int tokens, int cached) const {
  return prefill_calibration.factor * MeasuredPrefillMs(tokens, cached);
}

double DeviceProfile::MeasuredPrefillFixedMs() const {
  std::vector<double> xs, ys;
  UncachedPrefill(prefill, &xs, &ys);
  if (xs.empty()) return 0;
  // The intercept of the first two points.
  const double slope = xs.size() > 1 ? (ys[1] - ys[0]) / (xs[1] - xs[0]) : 0;
  return std::clamp(ys[0] - xs[0] * slope, 0.0, ys[0]);
}

double DeviceProfile::MeasuredPrefillMs(int tokens, int cached) const {
  std::vector<double> xs, ys;
  UncachedPrefill(prefill, &xs, &ys);
  if (xs.empty()) return 0;
  if (cached <= 0) return Lerp(xs, ys, tokens);
  // Computing positions [cached, cached + tokens) costs what a whole prompt of that length costs
  // beyond its first `cached` positions (attention over the cached part included), plus the
  // step's fixed cost.
  const double fixed = MeasuredPrefillFixedMs();
  return std::max(fixed, Lerp(xs, ys, cached + tokens) - Lerp(xs, ys, cached) + fixed);
}

double DeviceProfile::PrefillBatchEfficiency(double prompts) const {
  if (prompts <= 1 || prefill_batches.empty()) return 1.0;
  const double fixed = MeasuredPrefillFixedMs();
  // (1, 1), then each point's measured step over the sum of its prompts' single costs.
  std::vector<double> ks = {1}, es = {1};
  for (const PrefillBatchPoint& b : prefill_batches) {
    const double sum = b.prompts * std::max(1e-9, MeasuredPrefillMs(b.tokens) - fixed);
    ks.push_back(b.prompts);
    es.push_back(std::clamp((b.ms - fixed) / sum, 0.25, 1.5));
  }
  if (prompts >= ks.back()) return es.back();
  const size_t i = std::upper_bound(ks.begin(), ks.end(), prompts) - ks.begin();
  const double t = (prompts - ks[i - 1]) / (ks[i] - ks[i - 1]);
  return es[i - 1] + t * (es[i] - es[i - 1]);
}

double DeviceProfile::DecodeStepMs(int batch, int context) const {
  const double measured = MeasuredDecodeStepMs(batch, context);
  return std::max(0.1 * measured, calibration.factor * measured + calibration.penalty_ms);
}

double DeviceProfile::MeasuredDecodeStepMs(int batch, int context) const {
  std::vector<double> batches, contexts;
  for (const DecodePoint& p : decode) {
    if (batches.empty() || batches.back() != p.batch) batches.push_back(p.batch);
    if (std::find(contexts.begin(), contexts.end(), p.context) == contexts.end()) {
      contexts.push_back(p.context);
    }
  }
  if (batches.empty()) return 0;
  std::sort(contexts.begin(), contexts.end());
  // ms[b][c] (ProfileFromJson checked the grid is full and sorted).
  std::vector<double> at_batch;
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<double> ys;
    for (size_t c = 0; c < contexts.size(); ++c) ys.push_back(decode[b * contexts.size() + c].ms);
    at_batch.push_back(Lerp(contexts, ys, context));
  }
  return Lerp(batches, at_batch, batch);
}

double DeviceProfile::TransferMs(int tokens) const {
  if (transfer.empty()) return 0;
  std::vector<double> xs, ys;
  for (const TransferPoint& p : transfer) {
    xs.push_back(p.tokens);
    ys.push_back(p.ms);
  }
  return Lerp(xs, ys, tokens);
}

std::string ProfileToJson(const DeviceProfile& p) {
  json j;
  j["version"] = p.version;
  j["model"] = p.model;
  j["device"] = p.device;
  j["host"] = p.host;
  j["date"] = p.date;
  j["block_size"] = p.block_size;
  j["kv_capacity_tokens"] = p.kv_capacity_tokens;
  j["kv_bytes_per_token"] = p.kv_bytes_per_token;
  j["max_num_batched_tokens"] = p.max_num_batched_tokens;
  j["transfer_backend"] = p.transfer_backend;
  j["neighbours"] = p.neighbours;
  j["prefill"] = json::array();
  for (const PrefillPoint& x : p.prefill) {
    j["prefill"].push_back(
        {{"tokens", x.tokens}, {"cached_tokens", x.cached_tokens}, {"ms", x.ms}});
  }
  if (!p.prefill_batches.empty()) {
    j["prefill_batches"] = json::array();
    for (const PrefillBatchPoint& x : p.prefill_batches) {
      j["prefill_batches"].push_back({{"prompts", x.prompts}, {"tokens", x.tokens}, {"ms", x.ms}});
    }
  }
  j["decode"] = json::array();
  for (const DecodePoint& x : p.decode) {
    j["decode"].push_back({{"batch", x.batch}, {"context", x.context}, {"ms", x.ms}});
  }
  j["transfer"] = json::array();
  for (const TransferPoint& x : p.transfer) {
    j["transfer"].push_back({{"tokens", x.tokens}, {"bytes", x.bytes}, {"ms", x.ms}});
  }
  if (p.calibration.factor != 1.0 || p.calibration.penalty_ms != 0 || p.calibration.steps > 0) {
    const DecodeCalibration& c = p.calibration;
    j["calibration"] = {{"factor", c.factor},
                        {"penalty_ms", c.penalty_ms},
                        {"served_step_ms", c.served_step_ms},
                        {"served_interval_ms", c.served_interval_ms},
                        {"profiled_step_ms", c.profiled_step_ms},
                        {"batch", c.batch},
                        {"context", c.context},
                        {"step_overhead_ms", c.step_overhead_ms},
                        {"gap_ms", c.gap_ms},
                        {"steps", c.steps},
                        {"workers", c.workers},
                        {"date", c.date}};
  }
  if (p.prefill_calibration.factor != 1.0 || p.prefill_calibration.steps > 0) {
    const PrefillCalibration& c = p.prefill_calibration;
    j["prefill_calibration"] = {{"factor", c.factor},
                                {"served_step_ms", c.served_step_ms},
                                {"profiled_step_ms", c.profiled_step_ms},
                                {"chunks_per_step", c.chunks_per_step},
                                {"chunk_tokens", c.chunk_tokens},
                                {"cached_tokens", c.cached_tokens},
                                {"step_overhead_ms", c.step_overhead_ms},
                                {"steps", c.steps},
                                {"workers", c.workers},
                                {"date", c.date}};
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<DeviceProfile> ProfileFromJson(absl::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("file", "not valid JSON");
  if (absl::Status s =
          OnlyKeys(j, "top level",
                   {"version", "model", "device", "host", "date", "block_size",
                    "kv_capacity_tokens", "kv_bytes_per_token", "max_num_batched_tokens",
                    "transfer_backend", "neighbours", "prefill", "prefill_batches", "decode",
                    "transfer", "calibration", "prefill_calibration"});
      !s.ok()) {
    return s;
  }
  DeviceProfile p;
  if (absl::Status s =
          GetInt(j, "top level", "version", kProfileVersion, kProfileVersion, &p.version);
      !s.ok()) {
    return s;
  }
  for (auto [key, out, required] :
       {std::tuple<const char*, std::string*, bool>{"model", &p.model, true},
        {"device", &p.device, true},
        {"host", &p.host, false},
        {"date", &p.date, false},
        {"transfer_backend", &p.transfer_backend, false}}) {
    if (absl::Status s = GetString(j, key, required, out); !s.ok()) return s;
  }
  if (absl::Status s = GetInt(j, "top level", "block_size", 1, 1024, &p.block_size); !s.ok()) {
    return s;
  }
  if (absl::Status s = GetInt<int64_t>(j, "top level", "kv_capacity_tokens", 1, int64_t{1} << 40,
                                       &p.kv_capacity_tokens);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = GetInt<int64_t>(j, "top level", "kv_bytes_per_token", 1, int64_t{1} << 30,
                                       &p.kv_bytes_per_token);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = GetInt(j, "top level", "max_num_batched_tokens", 1, kMaxTokens,
                              &p.max_num_batched_tokens);
      !s.ok()) {
    return s;
  }
  if (j.contains("neighbours")) {  // optional: profiles written before it have none
    if (absl::Status s = GetInt(j, "top level", "neighbours", 0, 1024, &p.neighbours); !s.ok()) {
      return s;
    }
  }
  const auto list = [&](const char* key) -> absl::StatusOr<const json*> {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return Bad(key, "must be a list");
    if (it->size() > kMaxPoints) return Bad(key, absl::StrCat("more than ", kMaxPoints, " points"));
    return &*it;
  };
  absl::StatusOr<const json*> prefill = list("prefill");
  if (!prefill.ok()) return prefill.status();
  for (size_t i = 0; i < (*prefill)->size(); ++i) {
    const json& e = (**prefill)[i];
    const std::string where = absl::StrCat("prefill[", i, "]");
    PrefillPoint x;
    if (absl::Status s = OnlyKeys(e, where, {"tokens", "cached_tokens", "ms"}); !s.ok()) return s;
    if (absl::Status s = GetInt(e, where, "tokens", 1, kMaxTokens, &x.tokens); !s.ok()) return s;
    if (absl::Status s = GetInt(e, where, "cached_tokens", 0, kMaxTokens, &x.cached_tokens);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = GetMs(e, where, &x.ms); !s.ok()) return s;
    if (!p.prefill.empty()) {
      const PrefillPoint& prev = p.prefill.back();
      if (std::make_pair(x.cached_tokens != 0, x.tokens) <=
          std::make_pair(prev.cached_tokens != 0, prev.tokens)) {
        return Bad(where, "points must be sorted by length, distinct, cache hits last");
      }
    }
    p.prefill.push_back(x);
  }
  if (std::count_if(p.prefill.begin(), p.prefill.end(),
                    [](const PrefillPoint& x) { return x.cached_tokens == 0; }) < 2) {
    return Bad("prefill", "needs at least two points without a cache hit");
  }
  if (j.contains("prefill_batches")) {  // optional: profiles written before it have none
    absl::StatusOr<const json*> batches = list("prefill_batches");
    if (!batches.ok()) return batches.status();
    for (size_t i = 0; i < (*batches)->size(); ++i) {
      const json& e = (**batches)[i];
      const std::string where = absl::StrCat("prefill_batches[", i, "]");
      PrefillBatchPoint x;
      if (absl::Status s = OnlyKeys(e, where, {"prompts", "tokens", "ms"}); !s.ok()) return s;
      if (absl::Status s = GetInt(e, where, "prompts", 2, 1 << 16, &x.prompts); !s.ok()) return s;
      if (absl::Status s = GetInt(e, where, "tokens", 1, kMaxTokens, &x.tokens); !s.ok()) return s;
      if (absl::Status s = GetMs(e, where, &x.ms); !s.ok()) return s;
      if (!p.prefill_batches.empty() && x.prompts <= p.prefill_batches.back().prompts) {
        return Bad(where, "points must be sorted by prompts and distinct");
      }
      p.prefill_batches.push_back(x);
    }
  }
  absl::StatusOr<const json*> decode = list("decode");
  if (!decode.ok()) return decode.status();
  for (size_t i = 0; i < (*decode)->size(); ++i) {
    const json& e = (**decode)[i];
    const std::string where = absl::StrCat("decode[", i, "]");
    DecodePoint x;
    if (absl::Status s = OnlyKeys(e, where, {"batch", "context", "ms"}); !s.ok()) return s;
    if (absl::Status s = GetInt(e, where, "batch", 1, 1 << 16, &x.batch); !s.ok()) return s;
    if (absl::Status s = GetInt(e, where, "context", 0, kMaxTokens, &x.context); !s.ok()) return s;
    if (absl::Status s = GetMs(e, where, &x.ms); !s.ok()) return s;
    if (!p.decode.empty() && std::make_pair(x.batch, x.context) <=
                                 std::make_pair(p.decode.back().batch, p.decode.back().context)) {
      return Bad(where, "points must be sorted by (batch, context) and distinct");
    }
    p.decode.push_back(x);
  }
  // A full grid: every batch measured at the same contexts.
  std::vector<int> contexts;
  for (const DecodePoint& x : p.decode) {
    if (x.batch == p.decode.front().batch) contexts.push_back(x.context);
  }
  if (p.decode.empty() || p.decode.size() % contexts.size() != 0) {
    return Bad("decode", "must be a full grid of batch sizes times contexts");
  }
  for (size_t i = 0; i < p.decode.size(); ++i) {
    if (p.decode[i].context != contexts[i % contexts.size()] ||
        p.decode[i].batch != p.decode[i - i % contexts.size()].batch) {
      return Bad(absl::StrCat("decode[", i, "]"),
                 "must be a full grid of batch sizes times contexts");
    }
  }
  absl::StatusOr<const json*> transfer = list("transfer");
  if (!transfer.ok()) return transfer.status();
  for (size_t i = 0; i < (*transfer)->size(); ++i) {
    const json& e = (**transfer)[i];
    const std::string where = absl::StrCat("transfer[", i, "]");
    TransferPoint x;
    if (absl::Status s = OnlyKeys(e, where, {"tokens", "bytes", "ms"}); !s.ok()) return s;
    if (absl::Status s = GetInt(e, where, "tokens", 1, kMaxTokens, &x.tokens); !s.ok()) return s;
    if (absl::Status s = GetInt<int64_t>(e, where, "bytes", 1, int64_t{1} << 40, &x.bytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = GetMs(e, where, &x.ms); !s.ok()) return s;
    if (!p.transfer.empty() && x.tokens <= p.transfer.back().tokens) {
      return Bad(where, "points must be sorted by length and distinct");
    }
    p.transfer.push_back(x);
  }
  if (p.transfer.empty() != p.transfer_backend.empty()) {
    return Bad("transfer", "points need 'transfer_backend', and it needs points");
  }
  if (j.contains("calibration")) {  // optional: uncalibrated profiles have none
    if (absl::Status s = ParseCalibration(j["calibration"], &p.calibration); !s.ok()) return s;
  }
  if (j.contains("prefill_calibration")) {
    if (absl::Status s = ParsePrefillCalibration(j["prefill_calibration"], &p.prefill_calibration);
        !s.ok()) {
      return s;
    }
  }
  return p;
}

absl::StatusOr<DeviceProfile> LoadProfile(const std::string& path) {
  constexpr size_t kMaxBytes = 16 << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string text;
  text.resize(kMaxBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", kMaxBytes, " bytes"));
  }
  absl::StatusOr<DeviceProfile> p = ProfileFromJson(text);
  if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", p.status().message()));
  return p;
}

}  // namespace tandem::planning
