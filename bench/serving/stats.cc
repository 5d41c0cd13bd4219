#include "bench/serving/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::bench {

absl::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNone:
      return "none";
    case ErrorKind::kConnect:
      return "connect";
    case ErrorKind::kHttpStatus:
      return "http_status";
    case ErrorKind::kReset:
      return "reset";
    case ErrorKind::kTruncated:
      return "truncated";
    case ErrorKind::kMalformed:
      return "malformed";
    case ErrorKind::kStreamError:
      return "stream_error";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::optional<double> Tpot(const RequestRecord& r) {
  if (r.completion_tokens < 2) return std::nullopt;
  return (r.e2e_s - r.ttft_s) / (r.completion_tokens - 1);
}

absl::StatusOr<Slo> ParseSlo(absl::string_view text) {
  Slo slo;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> kv = absl::StrSplit(part, absl::ByAnyChar("=:"));
    double ms = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(absl::StripAsciiWhitespace(kv[1]), &ms) || !(ms > 0) ||
        std::isinf(ms)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slo: expected NAME=MILLISECONDS with NAME in ttft, tpot, e2el; got '", part, "'"));
    }
    absl::string_view name = absl::StripAsciiWhitespace(kv[0]);
    if (name == "ttft") {
      slo.ttft_ms = ms;
    } else if (name == "tpot") {
      slo.tpot_ms = ms;
    } else if (name == "e2el" || name == "e2e") {
      slo.e2el_ms = ms;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--slo: unknown metric '", name, "' (ttft, tpot, e2el)"));
    }
  }
  if (slo.empty()) return absl::InvalidArgumentError("--slo: no objective given");
  return slo;
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_ms && r.ttft_s * 1e3 > *slo.ttft_ms) return false;
  if (slo.e2el_ms && r.e2e_s * 1e3 > *slo.e2el_ms) return false;
  if (slo.tpot_ms) {
    // A single-token response has no TPOT and cannot violate it (vLLM counts it as 0).
    std::optional<double> tpot = Tpot(r);
    if (tpot && *tpot * 1e3 > *slo.tpot_ms) return false;
  }
  return true;
}

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution Describe(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  const double n = static_cast<double>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double sq = 0;
  for (double v : values) sq += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(sq / n);
  d.median = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  d.min = values.front();
  d.max = values.back();
  return d;
}

Summary Summarize(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo) {
  Summary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  std::vector<RequestRecord> completed;
  for (const RequestRecord& r : records) {
    if (r.error == ErrorKind::kCancelled) {
      ++s.cancelled;
      continue;
    }
    if (!r.ok()) {
      ++s.failed;
      ++s.errors_by_kind[std::string(ErrorKindName(r.error))];
      if (r.http_status != 0 && r.http_status != 200) ++s.http_status_counts[r.http_status];
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.completion_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    if (std::optional<double> t = Tpot(r)) tpot.push_back(*t * 1e3);
    for (double g : r.itls_s) itl.push_back(g * 1e3);
    e2el.push_back(r.e2e_s * 1e3);
    if (slo.empty() || MeetsSlo(r, slo)) ++s.good_completed;
    completed.push_back(r);
  }
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.input_throughput = static_cast<double>(s.total_input_tokens) / duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
    s.request_goodput = s.good_completed / duration_s;
  }
  s.ttft_ms = Describe(std::move(ttft));
  s.tpot_ms = Describe(std::move(tpot));
  s.itl_ms = Describe(std::move(itl));
  s.e2el_ms = Describe(std::move(e2el));
  // One-second windows (vLLM's max_output_tokens_per_s); a shorter run uses a tenth of its
  // length so that the peak is not a partial window.
  const double bin_s = duration_s >= 10 ? 1.0 : std::max(duration_s / 10, 1e-3);
  for (double v : OutputTokensPerSecond(completed, bin_s)) {
    s.max_output_tokens_per_s = std::max(s.max_output_tokens_per_s, v);
  }
  return s;
}

std::vector<double> OutputTokensPerSecond(const std::vector<RequestRecord>& records, double bin_s) {
  std::vector<double> bins;
  auto add = [&](double t, double tokens) {
    if (t < 0) t = 0;
    const size_t i = static_cast<size_t>(t / bin_s);
    if (i >= bins.size()) bins.resize(i + 1, 0.0);
    bins[i] += tokens;
  };
  for (const RequestRecord& r : records) {
    if (!r.ok() || r.completion_tokens <= 0) continue;
    const size_t chunks = r.itls_s.size() + 1;
    const double per_chunk = static_cast<double>(r.completion_tokens) / chunks;
    double t = r.start_s + r.ttft_s;
    add(t, per_chunk);
    for (double g : r.itls_s) {
      t += g;
      add(t, per_chunk);
    }
  }
  for (double& b : bins) b /= bin_s;
  return bins;
}

}  // namespace tandem::bench
