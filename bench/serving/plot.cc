#include "bench/serving/plot.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::bench {
namespace {

struct Panel {
  double x, y, w, h;  // plot area inside the panel's margins
};

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// A step of 1, 2 or 5 times a power of ten giving about five ticks up to `max`.
double TickStep(double max) {
  if (!(max > 0)) return 1;
  const double raw = max / 5;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

std::string Num(double v) { return absl::StrFormat("%g", v); }

// Axes, ticks and labels for [0, xmax] x [0, ymax].
void Axes(std::string* svg, const Panel& p, const std::string& title, const std::string& xlabel,
          const std::string& ylabel, double xmax, double ymax) {
  absl::StrAppendFormat(svg,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"#fafafa\" stroke=\"#444\"/>\n",
                        p.x, p.y, p.w, p.h);
  absl::StrAppendFormat(svg,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"14\" "
                        "font-weight=\"bold\">%s</text>\n",
                        p.x + p.w / 2, p.y - 10, Escape(title));
  absl::StrAppendFormat(svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        p.x + p.w / 2, p.y + p.h + 34, Escape(xlabel));
  absl::StrAppendFormat(svg,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
                        p.x - 46, p.y + p.h / 2, p.x - 46, p.y + p.h / 2, Escape(ylabel));
  const double xs = TickStep(xmax), ys = TickStep(ymax);
  for (double t = 0; t <= xmax * 1.0001; t += xs) {
    const double px = p.x + t / xmax * p.w;
    absl::StrAppendFormat(svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          px, p.y, px, p.y + p.h, px, p.y + p.h + 16, Num(t));
  }
  for (double t = 0; t <= ymax * 1.0001; t += ys) {
    const double py = p.y + p.h - t / ymax * p.h;
    absl::StrAppendFormat(svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          p.x, py, p.x + p.w, py, p.x - 6, py + 4, Num(t));
  }
}

void Polyline(std::string* svg, const Panel& p, const std::vector<std::pair<double, double>>& pts,
              double xmax, double ymax, const char* color) {
  std::string points;
  for (const auto& [x, y] : pts) {
    absl::StrAppendFormat(&points, "%.1f,%.1f ", p.x + std::min(x / xmax, 1.0) * p.w,
                          p.y + p.h - std::min(y / ymax, 1.0) * p.h);
  }
  absl::StrAppendFormat(svg,
                        "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                        "points=\"%s\"/>\n",
                        color, points);
}

void EmptyNote(std::string* svg, const Panel& p) {
  absl::StrAppendFormat(svg,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">"
                        "no samples</text>\n",
                        p.x + p.w / 2, p.y + p.h / 2);
}

void Cdf(std::string* svg, const Panel& p, const std::string& title, std::vector<double> ms,
         const char* color) {
  std::sort(ms.begin(), ms.end());
  const double xmax = ms.empty() || !(ms.back() > 0) ? 1.0 : ms.back() * 1.05;
  Axes(svg, p, absl::StrCat(title, ms.empty() ? "" : absl::StrCat(" (n=", ms.size(), ")")),
       "milliseconds", "fraction of samples", xmax, 1.0);
  if (ms.empty()) return EmptyNote(svg, p);
  std::vector<std::pair<double, double>> pts;
  const size_t n = ms.size();
  const size_t step = std::max<size_t>(1, n / 400);
  pts.emplace_back(ms[0], 0.0);
  for (size_t i = 0; i < n; i += step) pts.emplace_back(ms[i], static_cast<double>(i + 1) / n);
  pts.emplace_back(ms[n - 1], 1.0);
  Polyline(svg, p, pts, xmax, 1.0, color);
}

}  // namespace

std::string RenderSvg(const std::vector<RequestRecord>& records, const std::string& title) {
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (!r.ok()) continue;
    ttft.push_back(r.ttft_s * 1e3);
    if (std::optional<double> t = Tpot(r)) tpot.push_back(*t * 1e3);
    for (double g : r.itls_s) itl.push_back(g * 1e3);
    e2el.push_back(r.e2e_s * 1e3);
  }
  const double width = 1200, height = 720;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" "
      "font-weight=\"bold\">%s</text>\n",
      width, height, width, height, width / 2, Escape(title));
  const double pw = 300, ph = 220;
  Cdf(&svg, {80, 70, pw, ph}, "TTFT", ttft, "#1f77b4");
  Cdf(&svg, {470, 70, pw, ph}, "TPOT", tpot, "#ff7f0e");
  Cdf(&svg, {860, 70, pw, ph}, "ITL", itl, "#2ca02c");
  Cdf(&svg, {80, 400, pw, ph}, "End-to-end latency", e2el, "#d62728");

  // Output tokens/s over time, in windows sized to give up to ~200 points.
  double end = 0;
  for (const RequestRecord& r : records) end = std::max(end, r.start_s + r.e2e_s);
  const double bin = std::max(0.1, end / 200);
  std::vector<double> tps = OutputTokensPerSecond(records, bin);
  const Panel tp{470, 400, 690, ph};
  double ymax = 0;
  for (double v : tps) ymax = std::max(ymax, v);
  const double xmax = std::max(end, bin);
  Axes(&svg, tp, "Output throughput over time", "seconds since start", "output tokens/s", xmax,
       ymax > 0 ? ymax * 1.1 : 1.0);
  if (tps.empty()) {
    EmptyNote(&svg, tp);
  } else {
    std::vector<std::pair<double, double>> pts;
    for (size_t i = 0; i < tps.size(); ++i) pts.emplace_back((i + 0.5) * bin, tps[i]);
    Polyline(&svg, tp, pts, xmax, ymax > 0 ? ymax * 1.1 : 1.0, "#9467bd");
  }
  int ok = 0, failed = 0;
  for (const RequestRecord& r : records) (r.ok() ? ok : failed) += 1;
  absl::StrAppendFormat(&svg,
                        "<text x=\"80\" y=\"700\" font-size=\"12\">%d completed, %d not "
                        "completed; latency CDFs over completed requests</text>\n",
                        ok, failed);
  svg.append("</svg>\n");
  return svg;
}

}  // namespace tandem::bench
