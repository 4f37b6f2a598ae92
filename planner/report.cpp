#include "planner/report.h"

#include <algorithm>
#include <map>
#include <regex>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "planner/cost_model.h"
#include "runtime/core/format_bytes.h"

namespace mfsdp {

TextTable::TextTable(std::vector<std::string> header) { rows_.push_back(std::move(header)); }

void TextTable::add_row(std::vector<std::string> cells) {
  if (cells.size() != rows_.front().size())
    throw std::invalid_argument("[TextTable::add_row] row has " + std::to_string(cells.size()) +
                                " cells, header has " + std::to_string(rows_.front().size()));
  rows_.push_back(std::move(cells));
}

std::string TextTable::str() const {
  const size_t cols = rows_.front().size();
  std::vector<size_t> width(cols, 0);
  for (const auto& row : rows_)
    for (size_t c = 0; c < cols; ++c) width[c] = std::max(width[c], row[c].size());
  auto line = [&](const std::vector<std::string>& row) {
    std::string out;
    for (size_t c = 0; c < cols; ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c > 0) out += "  ";
      out += c == 0 ? row[c] + pad : pad + row[c];
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(rows_.front());
  const size_t total = std::accumulate(width.begin(), width.end(), size_t{0}) + 2 * (cols - 1);
  out += std::string(total, '-') + "\n";
  for (size_t i = 1; i < rows_.size(); ++i) out += line(rows_[i]);
  return out;
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

namespace {
std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}
}  // namespace

std::string format_flops(double flops) {
  static const char* units[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  int u = 0;
  while (std::fabs(flops) >= 1000.0 && u < 6) {
    flops /= 1000.0;
    ++u;
  }
  return fixed(flops, u == 0 ? 0 : 2) + " " + units[u];
}

std::string format_ratio(double r) { return fixed(r, 3); }

std::string routing_table(const ShardPlan& plan) {
  const auto& st = plan.stats;
  const double total = static_cast<double>(st.muon_numel + st.adamw_numel);
  auto share = [&](int64_t n) { return fixed(total > 0 ? 100.0 * n / total : 0.0, 1) + "%"; };
  TextTable t({"optimizer", "tensors", "elements", "share"});
  t.add_row({"muon", std::to_string(st.muon_params), format_count(st.muon_numel),
             share(st.muon_numel)});
  t.add_row({"adamw", std::to_string(st.adamw_params), format_count(st.adamw_numel),
             share(st.adamw_numel)});
  return t.str();
}

std::string balance_table(const std::vector<std::pair<std::string, const ShardPlan*>>& columns) {
  if (columns.empty()) throw std::invalid_argument("[balance_table] no plans given");
  std::vector<std::string> header{"figure"};
  for (const auto& c : columns) header.push_back(c.first);
  TextTable t(header);
  auto row = [&](const std::string& name, auto f) {
    std::vector<std::string> cells{name};
    for (const auto& c : columns) cells.push_back(f(c.second->stats));
    t.add_row(std::move(cells));
  };
  row("optimizer FLOPs/step, max rank", [](const BalanceStats& s) { return format_flops(s.flops_max()); });
  row("optimizer FLOPs/step, mean", [](const BalanceStats& s) { return format_flops(s.flops_mean()); });
  row("optimizer FLOPs max/mean", [](const BalanceStats& s) { return format_ratio(s.flops_ratio()); });
  row("bytes per rank, max", [](const BalanceStats& s) { return format_bytes(static_cast<double>(s.bytes_max())); });
  row("bytes per rank, mean", [](const BalanceStats& s) { return format_bytes(s.bytes_mean()); });
  row("bytes max/mean", [](const BalanceStats& s) { return format_ratio(s.bytes_ratio()); });
  row("unit segment max/mean, worst unit",
      [](const BalanceStats& s) { return format_ratio(s.worst_unit_ratio()); });
  row("unit segment max/mean, mean of units", [](const BalanceStats& s) {
    double sum = 0.0;
    for (size_t u = 0; u < s.unit_segment_max_bytes.size(); ++u) sum += s.unit_ratio(static_cast<int>(u));
    return format_ratio(s.unit_segment_max_bytes.empty() ? 1.0 : sum / s.unit_segment_max_bytes.size());
  });
  row("empty segments (unit x rank)", [](const BalanceStats& s) { return format_count(s.empty_segments); });
  row("split tensors", [](const BalanceStats& s) { return format_count(s.split_tensors); });
  row("padding elements", [](const BalanceStats& s) { return format_count(s.padding_numel); });
  return t.str();
}

std::string unit_table(const ShardPlan& plan) {
  TextTable t({"unit", "tensors", "bytes", "segment max", "segment mean", "max/mean", "empty"});
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const auto& ul = plan.units[u];
    const int64_t empty = std::count(ul.segment_numel.begin(), ul.segment_numel.end(), int64_t{0});
    t.add_row({ul.name, std::to_string(plan.shards_in_unit(static_cast<int>(u)).size()),
               format_bytes(static_cast<double>(ul.total_numel() * kF32Bytes)),
               format_bytes(static_cast<double>(plan.stats.unit_segment_max_bytes.at(u))),
               format_bytes(plan.stats.unit_segment_mean_bytes.at(u)),
               format_ratio(plan.stats.unit_ratio(static_cast<int>(u))),
               std::to_string(empty) + "/" + std::to_string(plan.world_size)});
  }
  return t.str();
}

std::string rank_table(const ShardPlan& plan) {
  const int N = plan.world_size;
  std::vector<int> mats(N, 0), tails(N, 0);
  std::vector<int64_t> elems(N, 0);
  for (const auto& s : plan.shards)
    for (const auto& p : s.pieces) {
      (s.optimizer == OptimizerKind::muon ? mats : tails)[p.rank] += 1;
      elems[p.rank] += p.numel;
    }
  TextTable t({"rank", "matrices", "tail tensors", "elements", "optimizer FLOPs", "bytes"});
  for (int r = 0; r < N; ++r)
    t.add_row({std::to_string(r), std::to_string(mats[r]), std::to_string(tails[r]),
               format_count(elems[r]), format_flops(plan.stats.rank_flops.at(r)),
               format_bytes(static_cast<double>(plan.stats.rank_bytes.at(r)))});
  return t.str();
}

std::string expert_table(const ShardPlan& plan) {
  static const std::regex expert(R"(model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight)");
  // rank -> (layer, expert) -> the letters of the matrices it owns, in g, u, d order
  std::vector<std::map<std::pair<int, int>, std::string>> owned(static_cast<size_t>(plan.world_size));
  int matrices = 0;
  for (const auto& s : plan.shards) {
    std::smatch m;
    if (!std::regex_match(s.name, m, expert) || s.pieces.empty()) continue;
    const int rank = s.owner >= 0 ? s.owner : s.pieces.front().rank;
    std::string& letters = owned.at(static_cast<size_t>(rank))[{std::stoi(m[1]), std::stoi(m[2])}];
    letters += m[3].str()[0];
    std::sort(letters.begin(), letters.end(), [](char a, char b) {
      const std::string order = "gud";
      return order.find(a) < order.find(b);
    });
    ++matrices;
  }
  if (matrices == 0) return "";
  TextTable t({"rank", "expert matrices", "whole experts"});
  std::string lists;
  for (int r = 0; r < plan.world_size; ++r) {
    int count = 0, whole = 0;
    std::string list;
    for (const auto& [key, letters] : owned[static_cast<size_t>(r)]) {
      count += static_cast<int>(letters.size());
      whole += letters == "gud";
      list += (list.empty() ? "" : " ") + std::to_string(key.first) + "." + std::to_string(key.second) +
              (letters == "gud" ? "" : ":" + letters);
    }
    t.add_row({std::to_string(r), std::to_string(count), std::to_string(whole)});
    lists += "rank " + std::to_string(r) + ": " + (list.empty() ? "-" : list) + "\n";
  }
  return t.str() + "experts by rank (layer.expert, \":\" and the matrices g/u/d when the rank holds only some):\n" + lists;
}

}  // namespace mfsdp
