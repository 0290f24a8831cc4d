#include "lib/formats/nemo/yaml_subset.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"

namespace reshard {

namespace {

struct Line {
  int number = 0;  // 1-based, for messages
  int indent = 0;
  std::string content;  // without indentation, comment and trailing spaces
};

// Where a comment starts in `line` (a '#' at the start or after a space, outside quotes), or
// npos.
size_t CommentStart(absl::string_view line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if ((c == '\'' || c == '"') && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '-' ||
                                    line[i - 1] == '[' || line[i - 1] == ',')) {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ')) {
      return i;
    }
  }
  return absl::string_view::npos;
}

class Parser {
 public:
  Parser(std::vector<Line> lines, absl::string_view path)
      : lines_(std::move(lines)), path_(path) {}

  absl::StatusOr<YamlNode> Document() {
    if (lines_.empty()) return YamlNode();
    ASSIGN_OR_RETURN(YamlNode root, Block(lines_[0].indent, 0));
    if (next_ < lines_.size()) {
      return Error(lines_[next_], "unexpected indentation");
    }
    return root;
  }

 private:
  absl::Status Error(const Line& line, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": line ", line.number, ": ", what, " (NeMo configs are read as "
                     "the block-style YAML OmegaConf writes)"));
  }

  absl::Status Count(const Line& line) {
    if (++nodes_ > kMaxYamlNodes) {
      return absl::ResourceExhaustedError(absl::StrCat(path_, ": line ", line.number,
                                                       ": more than ", kMaxYamlNodes, " nodes"));
    }
    return absl::OkStatus();
  }

  static bool IsItem(const Line& line) {
    return line.content == "-" || absl::StartsWith(line.content, "- ");
  }

  // The block (mapping or sequence) whose lines start at next_ with `indent`.
  absl::StatusOr<YamlNode> Block(int indent, int depth) {
    if (depth > kMaxYamlDepth) {
      return Error(lines_[next_], absl::StrCat("nested deeper than ", kMaxYamlDepth));
    }
    return IsItem(lines_[next_]) ? Sequence(indent, depth) : Mapping(indent, depth);
  }

  absl::StatusOr<YamlNode> Sequence(int indent, int depth) {
    YamlNode node;
    node.kind = YamlNode::Kind::kList;
    while (next_ < lines_.size() && lines_[next_].indent == indent && IsItem(lines_[next_])) {
      Line& line = lines_[next_];
      RETURN_IF_ERROR(Count(line));
      const std::string rest =
          std::string(absl::StripLeadingAsciiWhitespace(absl::string_view(line.content).substr(1)));
      if (rest.empty()) {
        ++next_;
        if (next_ < lines_.size() && lines_[next_].indent > indent) {
          ASSIGN_OR_RETURN(YamlNode item, Block(lines_[next_].indent, depth + 1));
          node.list.push_back(std::move(item));
        } else {
          node.list.emplace_back();
        }
        continue;
      }
      if (IsItem(Line{0, 0, rest}) || KeyEnd(rest) != std::string::npos) {
        // "- key: value" opens a mapping (or "- - x" a sequence) indented past the dash.
        const int inner = indent + static_cast<int>(line.content.size() - rest.size());
        line.indent = inner;
        line.content = rest;
        ASSIGN_OR_RETURN(YamlNode item, Block(inner, depth + 1));
        node.list.push_back(std::move(item));
        continue;
      }
      ASSIGN_OR_RETURN(YamlNode item, Scalar(line, rest));
      node.list.push_back(std::move(item));
      ++next_;
    }
    return node;
  }

  // Where a mapping key ends in `content` (the ':' followed by a space or the end), or npos.
  static size_t KeyEnd(absl::string_view content) {
    if (!content.empty() && (content[0] == '\'' || content[0] == '"')) {
      const size_t close = content.find(content[0], 1);
      if (close == absl::string_view::npos) return std::string::npos;
      if (close + 1 < content.size() && content[close + 1] == ':' &&
          (close + 2 == content.size() || content[close + 2] == ' ')) {
        return close + 1;
      }
      return std::string::npos;
    }
    for (size_t i = 0; i < content.size(); ++i) {
      if (content[i] == ':' && (i + 1 == content.size() || content[i + 1] == ' ')) return i;
    }
    return std::string::npos;
  }

  absl::StatusOr<YamlNode> Mapping(int indent, int depth) {
    YamlNode node;
    node.kind = YamlNode::Kind::kMap;
    while (next_ < lines_.size() && lines_[next_].indent == indent) {
      const Line& line = lines_[next_];
      if (IsItem(line)) return Error(line, "a sequence item inside a mapping");
      RETURN_IF_ERROR(Count(line));
      const size_t end = KeyEnd(line.content);
      if (end == std::string::npos) return Error(line, "expected \"key: value\"");
      absl::string_view key_text = absl::string_view(line.content).substr(0, end);
      std::string key;
      if (!key_text.empty() && (key_text[0] == '\'' || key_text[0] == '"')) {
        ASSIGN_OR_RETURN(YamlNode quoted, Scalar(line, key_text));
        key = quoted.scalar;
      } else {
        if (key_text.empty() || key_text[0] == '?') return Error(line, "complex or empty key");
        key = std::string(key_text);
      }
      for (const auto& [existing, value] : node.map) {
        if (existing == key) return Error(line, absl::StrCat("key \"", key, "\" appears twice"));
      }
      const std::string rest = std::string(
          absl::StripLeadingAsciiWhitespace(absl::string_view(line.content).substr(end + 1)));
      ++next_;
      if (!rest.empty()) {
        ASSIGN_OR_RETURN(YamlNode value, Scalar(line, rest));
        node.map.emplace_back(std::move(key), std::move(value));
        continue;
      }
      YamlNode value;
      if (next_ < lines_.size() && (lines_[next_].indent > indent ||
                                    (lines_[next_].indent == indent && IsItem(lines_[next_])))) {
        ASSIGN_OR_RETURN(value, Block(lines_[next_].indent, depth + 1));
      }
      node.map.emplace_back(std::move(key), std::move(value));
    }
    if (next_ < lines_.size() && lines_[next_].indent > indent) {
      return Error(lines_[next_], "unexpected indentation");
    }
    return node;
  }

  absl::StatusOr<YamlNode> Scalar(const Line& line, absl::string_view text) {
    YamlNode node;
    const char first = text[0];
    if (first == '&' || first == '*' || first == '!' || first == '|' || first == '>' ||
        first == '%' || first == '@' || first == '`' || first == '{' || first == '?') {
      if (text == "{}") {
        node.kind = YamlNode::Kind::kMap;
        return node;
      }
      return Error(line, absl::StrCat("unsupported YAML: ", text));
    }
    if (first == '[') {
      if (text.back() != ']') return Error(line, "unterminated flow sequence");
      node.kind = YamlNode::Kind::kList;
      absl::string_view inside = absl::StripAsciiWhitespace(text.substr(1, text.size() - 2));
      if (inside.empty()) return node;
      for (absl::string_view item : absl::StrSplit(inside, ',')) {
        item = absl::StripAsciiWhitespace(item);
        if (item.empty() || item.find_first_of("[]{}'\"&*!:#") != absl::string_view::npos) {
          return Error(line, "a flow sequence of other than plain scalars");
        }
        RETURN_IF_ERROR(Count(line));
        ASSIGN_OR_RETURN(YamlNode value, Scalar(line, item));
        node.list.push_back(std::move(value));
      }
      return node;
    }
    if (first == '\'' || first == '"') {
      if (text.size() < 2 || text.back() != first) return Error(line, "unterminated quote");
      absl::string_view inside = text.substr(1, text.size() - 2);
      std::string out;
      for (size_t i = 0; i < inside.size(); ++i) {
        const char c = inside[i];
        if (first == '\'' && c == '\'') {
          if (i + 1 >= inside.size() || inside[i + 1] != '\'') {
            return Error(line, "a lone quote inside a quoted scalar");
          }
          out.push_back('\'');
          ++i;
        } else if (first == '"' && c == '"') {
          return Error(line, "a lone quote inside a quoted scalar");
        } else if (first == '"' && c == '\\') {
          if (i + 1 >= inside.size()) return Error(line, "a dangling escape");
          const char e = inside[++i];
          switch (e) {
            case '"':
            case '\\':
            case '/':
              out.push_back(e);
              break;
            case 'n':
              out.push_back('\n');
              break;
            case 't':
              out.push_back('\t');
              break;
            default:
              return Error(line, absl::StrCat("unsupported escape \\", std::string(1, e)));
          }
        } else {
          out.push_back(c);
        }
      }
      node.kind = YamlNode::Kind::kScalar;
      node.scalar = std::move(out);
      return node;
    }
    if (text == "null" || text == "~" || text == "Null" || text == "NULL") return node;
    node.kind = YamlNode::Kind::kScalar;
    node.scalar = std::string(text);
    return node;
  }

  std::vector<Line> lines_;
  absl::string_view path_;
  size_t next_ = 0;
  int64_t nodes_ = 0;
};

}  // namespace

const YamlNode* YamlNode::Get(absl::string_view key) const {
  if (kind != Kind::kMap) return nullptr;
  for (const auto& [name, value] : map) {
    if (name == key) return &value;
  }
  return nullptr;
}

absl::StatusOr<YamlNode> ParseYamlSubset(absl::string_view text, absl::string_view path) {
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    size_t indent = 0;
    while (indent < raw.size() && raw[indent] == ' ') ++indent;
    if (indent < raw.size() && raw[indent] == '\t') {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": line ", number, ": a tab in the indentation"));
    }
    absl::string_view content = raw.substr(indent);
    const size_t comment = CommentStart(content);
    if (comment != absl::string_view::npos) content = content.substr(0, comment);
    content = absl::StripTrailingAsciiWhitespace(content);
    if (content.empty()) continue;
    if (lines.empty() && indent == 0 && (content == "---" || absl::StartsWith(content, "--- "))) {
      if (content != "---") {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": line ", number, ": content after ---"));
      }
      continue;
    }
    if (content == "---" || content == "...") {
      if (content == "...") break;
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": line ", number, ": a second document"));
    }
    if (indent > (1 << 16)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": line ", number, ": indented past 65536"));
    }
    lines.push_back(Line{number, static_cast<int>(indent), std::string(content)});
  }
  Parser parser(std::move(lines), path);
  return parser.Document();
}

std::optional<int64_t> YamlInt(const YamlNode* node) {
  if (node == nullptr || node->kind != YamlNode::Kind::kScalar) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(node->scalar, &value)) return std::nullopt;
  return value;
}

std::optional<std::string> YamlString(const YamlNode* node) {
  if (node == nullptr || node->kind != YamlNode::Kind::kScalar) return std::nullopt;
  return node->scalar;
}

std::optional<bool> YamlBool(const YamlNode* node) {
  const std::optional<std::string> text = YamlString(node);
  if (!text.has_value()) return std::nullopt;
  if (*text == "true" || *text == "True") return true;
  if (*text == "false" || *text == "False") return false;
  return std::nullopt;
}

}  // namespace reshard
