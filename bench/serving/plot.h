#pragma once
// SVG rendering of one benchmark run: CDFs of TTFT, TPOT, ITL and end-to-end latency, and output
// tokens/s over time. Self-contained SVG text (no scripts, fonts or network resources).
// Pure function; empty metrics draw an empty panel saying so.

#include <string>
#include <vector>

#include "bench/serving/stats.h"

namespace tandem::bench {

std::string RenderSvg(const std::vector<RequestRecord>& records, const std::string& title);

}  // namespace tandem::bench
