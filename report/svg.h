// Small charts as inline SVG for `cohort report`: line charts (a mark per
// point) and stacked bar charts (a rect per non-zero segment), with text
// escaped for HTML. No script, no external reference (the SVG is inline in
// HTML5, so it carries no xmlns either).
//
// The marks are findable: every chart is a <figure class="chart"
// data-plot=ID>, every series a <g class="series" data-series=ID
// data-run=R> whose marks are its <circle> (line charts) or <rect> (bar
// charts) children, one per point drawn. A chart without a single point is a
// <figure class="chart nodata"> that says `empty_text` instead of drawing an
// empty axis.
#ifndef COHORT_REPORT_SVG_H_
#define COHORT_REPORT_SVG_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::report {

// `text` with & < > " ' replaced by entities: safe in HTML text and in
// quoted attribute values.
std::string EscapeHtml(std::string_view text);

// How axis ticks and tooltips print a value.
enum class Unit { kNumber, kBytes, kSeconds, kPerSecond };

// "0.8345", "12.3 KB", "1.25 s", "512 /s": a value for a reader.
std::string FormatValue(double value, Unit unit);

// One of a small fixed palette (wraps around); the runs' colours.
std::string PaletteColor(int index);

struct LineSeries {
  std::string id;                                 // data-series.
  std::string name;                               // The legend's text.
  int run = 0;                                    // data-run.
  int color = 0;                                  // PaletteColor index.
  int dash = 0;                                   // 0: solid; 1..3: dashed, dotted, dash-dot.
  std::vector<std::pair<double, double>> points;  // (x, y), in x order.
};

struct LineChart {
  LineChart(std::string id_, std::string title_, std::string x_label_, std::string y_label_)
      : id(std::move(id_)),
        title(std::move(title_)),
        x_label(std::move(x_label_)),
        y_label(std::move(y_label_)) {}
  std::string id;  // data-plot.
  std::string title;
  std::string x_label;
  std::string y_label;
  Unit unit = Unit::kNumber;
  std::vector<LineSeries> series;
  std::string empty_text;  // Said instead of the chart when no series has a point.
  std::string note;        // A line under the chart (what the figures are), may be empty.
};

// A <figure> with the chart and an HTML legend (series without points say
// "none recorded" there).
std::string RenderLineChart(const LineChart& chart);

struct BarStack {
  std::string id;              // data-series.
  std::string name;            // The legend's text.
  std::vector<double> values;  // One per category; <= 0 draws nothing.
};

struct BarChart {
  BarChart(std::string id_, int run_, std::string title_, std::string x_label_,
           std::string y_label_)
      : id(std::move(id_)),
        run(run_),
        title(std::move(title_)),
        x_label(std::move(x_label_)),
        y_label(std::move(y_label_)) {}
  std::string id;  // data-plot.
  int run = 0;     // data-run of every series.
  std::string title;
  std::string x_label;
  std::string y_label;
  Unit unit = Unit::kNumber;
  std::vector<std::string> categories;  // Along x, in order.
  std::vector<BarStack> stacks;         // Stacked bottom to top, coloured in order.
  std::string empty_text;
  std::string note;
};

// A <figure> with the stacked bars and a legend.
std::string RenderBarChart(const BarChart& chart);

}  // namespace cohort::report

#endif  // COHORT_REPORT_SVG_H_
