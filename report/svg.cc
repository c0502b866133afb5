#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace cohort::report {
namespace {

// The plot area inside a chart's SVG, in CSS pixels. Coordinates are
// printed with one decimal: a 100-round page stays small.
constexpr double kWidth = 860, kHeight = 260;
constexpr double kLeft = 76, kRight = 16, kTop = 12, kBottom = 42;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// "0.8345", "512", "12.3k", "4.5M": no exponent for a reader.
std::string Compact(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.3gG", v / 1e9);
  } else if (a >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.3gM", v / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buf, sizeof(buf), "%.3gk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  }
  return buf;
}

std::string Short(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

// 1, 2 or 5 times a power of ten, at least `raw`.
double NiceStep(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
  double Scale(double v, double length) const { return (v - lo) / (hi - lo) * length; }
};

// An axis over [lo, hi] widened to whole steps of about `target` ticks;
// `min_step` keeps rounds on whole numbers; steps are nice multiples of
// `scale` (1024^k for bytes, so that ticks read 64 KiB, not 62.5 KiB).
Axis NiceAxis(double lo, double hi, double min_step, double scale = 1, int target = 5) {
  if (!(hi > lo)) {
    lo = lo - std::max(1.0, std::fabs(lo) * 0.1);
    hi = hi + std::max(1.0, std::fabs(hi) * 0.1);
    if (lo < 0 && hi > 0 && lo > -2) lo = 0;
  }
  const double step = std::max(min_step, NiceStep((hi - lo) / scale / target) * scale);
  Axis axis;
  axis.lo = std::floor(lo / step + 1e-9) * step;
  axis.hi = std::ceil(hi / step - 1e-9) * step;
  if (axis.hi <= axis.lo) axis.hi = axis.lo + step;
  for (double t = axis.lo; t <= axis.hi + step * 1e-6; t += step) axis.ticks.push_back(t);
  return axis;
}

// The binary multiple ticks of `unit` count in below `top`.
double UnitScale(Unit unit, double top) {
  double scale = 1;
  if (unit == Unit::kBytes) {
    while (top / scale >= 1024 && scale < 1024.0 * 1024 * 1024 * 1024) scale *= 1024;
  }
  return scale;
}

std::string DashArray(int dash) {
  switch (dash % 4) {
    case 1:
      return " stroke-dasharray=\"7 4\"";
    case 2:
      return " stroke-dasharray=\"2 3\"";
    case 3:
      return " stroke-dasharray=\"9 3 2 3\"";
    default:
      return "";
  }
}

std::string Open(const std::string& id, const std::string& title) {
  return "<figure class=\"chart\" data-plot=\"" + EscapeHtml(id) + "\"><figcaption>" +
         EscapeHtml(title) + "</figcaption>\n";
}

std::string NoData(const std::string& id, const std::string& title, const std::string& text) {
  return "<figure class=\"chart nodata\" data-plot=\"" + EscapeHtml(id) + "\"><figcaption>" +
         EscapeHtml(title) + "</figcaption><p class=\"nodata\">" + EscapeHtml(text) +
         "</p></figure>\n";
}

std::string Note(const std::string& note) {
  return note.empty() ? "" : "<p class=\"note\">" + EscapeHtml(note) + "</p>";
}

// The frame: horizontal grid lines with the y ticks' labels, the axis labels.
std::string Frame(const Axis& y, Unit unit, const std::string& x_label,
                  const std::string& y_label) {
  std::string s = "<svg class=\"plot\" viewBox=\"0 0 " + Fixed(kWidth) + " " + Fixed(kHeight) +
                  "\" width=\"" + Fixed(kWidth) + "\" height=\"" + Fixed(kHeight) +
                  "\" role=\"img\">\n<g class=\"axis\">";
  for (double t : y.ticks) {
    const std::string py = Fixed(kTop + kPlotH - y.Scale(t, kPlotH));
    s += "<line x1=\"" + Fixed(kLeft) + "\" x2=\"" + Fixed(kLeft + kPlotW) + "\" y1=\"" + py +
         "\" y2=\"" + py + "\"/><text x=\"" + Fixed(kLeft - 6) + "\" y=\"" + py +
         "\" dy=\"4\" text-anchor=\"end\">" + EscapeHtml(FormatValue(t, unit)) + "</text>";
  }
  s += "<text x=\"" + Fixed(kLeft + kPlotW / 2) + "\" y=\"" + Fixed(kHeight - 4) +
       "\" text-anchor=\"middle\">" + EscapeHtml(x_label) + "</text>";
  s += "<text transform=\"translate(14 " + Fixed(kTop + kPlotH / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + EscapeHtml(y_label) + "</text></g>\n";
  return s;
}

std::string XTick(double px, const std::string& label) {
  const std::string x = Fixed(px);
  return "<line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + Fixed(kTop + kPlotH) + "\" y2=\"" +
         Fixed(kTop + kPlotH + 4) + "\"/><text x=\"" + x + "\" y=\"" + Fixed(kTop + kPlotH + 16) +
         "\" text-anchor=\"middle\">" + EscapeHtml(label) + "</text>";
}

bool AnyPoint(const LineChart& chart) {
  for (const auto& s : chart.series) {
    if (!s.points.empty()) return true;
  }
  return false;
}

// The x and y ranges of every point.
std::pair<Axis, Axis> LineAxes(const LineChart& chart) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = 0, y_hi = 0;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  if (y_hi == y_lo) y_hi = y_lo + 1;
  return {NiceAxis(x_lo, x_hi, 1), NiceAxis(y_lo, y_hi, 0, UnitScale(chart.unit, y_hi))};
}

std::string LineMarks(const LineSeries& s, const Axis& x, const Axis& y, const LineChart& chart) {
  const std::string color = PaletteColor(s.color);
  std::string out = "<g class=\"series\" data-series=\"" + EscapeHtml(s.id) + "\" data-run=\"" +
                    std::to_string(s.run) + "\" stroke=\"" + color + "\" fill=\"" + color +
                    "\">\n<polyline fill=\"none\" stroke-width=\"1.6\"" + DashArray(s.dash) +
                    " points=\"";
  std::string marks;
  for (const auto& [px, py] : s.points) {
    const std::string cx = Fixed(kLeft + x.Scale(px, kPlotW));
    const std::string cy = Fixed(kTop + kPlotH - y.Scale(py, kPlotH));
    out += cx + "," + cy + " ";
    marks += "<circle cx=\"" + cx + "\" cy=\"" + cy + "\" r=\"2.6\"><title>" +
             EscapeHtml(chart.x_label + " " + Short(px) + ": " + FormatValue(py, chart.unit)) +
             "</title></circle>\n";
  }
  return out + "\"/>\n" + marks + "</g>\n";
}

std::string LineLegend(const LineChart& chart) {
  std::string s = "<ul class=\"legend\">";
  for (const auto& series : chart.series) {
    s += "<li><svg width=\"30\" height=\"10\"><line x1=\"0\" y1=\"5\" x2=\"30\" y2=\"5\" "
         "stroke-width=\"2\" stroke=\"" +
         PaletteColor(series.color) + "\"" + DashArray(series.dash) + "/></svg>" +
         EscapeHtml(series.name) + (series.points.empty() ? " (none recorded)" : "") + "</li>";
  }
  return s + "</ul>";
}

double StackTotal(const BarChart& chart, size_t category) {
  double total = 0;
  for (const auto& stack : chart.stacks) {
    if (category < stack.values.size() && stack.values[category] > 0) {
      total += stack.values[category];
    }
  }
  return total;
}

// Every `every`-th category's label, so that labels do not overlap.
std::string BarTicks(const BarChart& chart, double band) {
  size_t longest = 1;
  for (const auto& c : chart.categories) longest = std::max(longest, c.size());
  const double label_px = 7.0 * longest + 8;
  const size_t every = std::max<size_t>(1, static_cast<size_t>(std::ceil(label_px / band)));
  std::string s = "<g class=\"axis\">";
  for (size_t i = 0; i < chart.categories.size(); i += every) {
    s += XTick(kLeft + band * (i + 0.5), chart.categories[i]);
  }
  return s + "</g>\n";
}

std::string BarMarks(const BarChart& chart, const Axis& y, double band) {
  std::vector<double> base(chart.categories.size(), 0);
  const std::string width = Fixed(std::max(0.6, band * 0.8));
  std::string s;
  for (size_t k = 0; k < chart.stacks.size(); ++k) {
    const BarStack& stack = chart.stacks[k];
    s += "<g class=\"series\" data-series=\"" + EscapeHtml(stack.id) + "\" data-run=\"" +
         std::to_string(chart.run) + "\" fill=\"" + PaletteColor(static_cast<int>(k)) + "\">\n";
    for (size_t i = 0; i < chart.categories.size() && i < stack.values.size(); ++i) {
      const double v = stack.values[i];
      if (!(v > 0)) continue;
      const double top = kTop + kPlotH - y.Scale(base[i] + v, kPlotH);
      const double height = y.Scale(base[i] + v, kPlotH) - y.Scale(base[i], kPlotH);
      base[i] += v;
      s += "<rect x=\"" + Fixed(kLeft + band * (i + 0.1)) + "\" y=\"" + Fixed(top) + "\" width=\"" +
           width + "\" height=\"" + Fixed(std::max(height, 0.5)) + "\"><title>" +
           EscapeHtml(chart.categories[i] + ", " + stack.name + ": " + FormatValue(v, chart.unit)) +
           "</title></rect>\n";
    }
    s += "</g>\n";
  }
  return s;
}

// The stacks that draw something (a category with nothing of a stack in
// any round has no swatch either).
std::string BarLegend(const BarChart& chart) {
  std::string s = "<ul class=\"legend\">";
  for (size_t k = 0; k < chart.stacks.size(); ++k) {
    const auto& values = chart.stacks[k].values;
    if (std::none_of(values.begin(), values.end(), [](double v) { return v > 0; })) continue;
    s += "<li><span class=\"swatch\" style=\"background:" + PaletteColor(static_cast<int>(k)) +
         "\"></span>" + EscapeHtml(chart.stacks[k].name) + "</li>";
  }
  return s + "</ul>";
}

}  // namespace

std::string EscapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatValue(double value, Unit unit) {
  char buf[48];
  switch (unit) {
    case Unit::kBytes: {
      const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
      int u = 0;
      while (std::fabs(value) >= 1024 && u < 4) value /= 1024, ++u;
      std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.3g %s", value, units[u]);
      break;
    }
    case Unit::kSeconds:
      std::snprintf(buf, sizeof(buf), "%.3g s", value);
      break;
    case Unit::kPerSecond:
      return Compact(value) + " /s";
    default:
      return Compact(value);
  }
  return buf;
}

std::string PaletteColor(int index) {
  static const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                         "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
                                         "#7f7f7f", "#bcbd22", "#393b79", "#637939"};
  constexpr int kSize = sizeof(kPalette) / sizeof(kPalette[0]);
  return kPalette[((index % kSize) + kSize) % kSize];
}

std::string RenderLineChart(const LineChart& chart) {
  if (!AnyPoint(chart)) return NoData(chart.id, chart.title, chart.empty_text);
  const auto [x, y] = LineAxes(chart);
  std::string s = Open(chart.id, chart.title) + Frame(y, chart.unit, chart.x_label, chart.y_label);
  s += "<g class=\"axis\">";
  for (double t : x.ticks) s += XTick(kLeft + x.Scale(t, kPlotW), Short(t));
  s += "</g>\n";
  for (const auto& series : chart.series) {
    if (!series.points.empty()) s += LineMarks(series, x, y, chart);
  }
  return s + "</svg>\n" + LineLegend(chart) + Note(chart.note) + "</figure>\n";
}

std::string RenderBarChart(const BarChart& chart) {
  double top = 0;
  for (size_t i = 0; i < chart.categories.size(); ++i) top = std::max(top, StackTotal(chart, i));
  if (!(top > 0)) return NoData(chart.id, chart.title, chart.empty_text);
  const Axis y = NiceAxis(0, top, 0, UnitScale(chart.unit, top));
  const double band = kPlotW / static_cast<double>(chart.categories.size());
  std::string s = Open(chart.id, chart.title) + Frame(y, chart.unit, chart.x_label, chart.y_label);
  s += BarTicks(chart, band) + BarMarks(chart, y, band);
  return s + "</svg>\n" + BarLegend(chart) + Note(chart.note) + "</figure>\n";
}

}  // namespace cohort::report
