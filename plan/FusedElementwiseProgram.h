// The program of a fused elementwise op (dg.fused_elementwise, the `fused_elementwise` kernel): a
// string contract between the compiler, which writes it as the op's `program` attribute (and the
// plan step's), and the kernels, which evaluate it (docs/kernels.md, "Fused elementwise chains").
//
// Text: instructions separated by ';', each `<op> <dtype> <value>...`. Values are numbered in
// order: the op's inputs are 0 … inputs−1, instruction i defines value inputs + i, and the last
// instruction's value is the result. Example, a bias add and a GELU over inputs x and bias:
//   "add f32 0 1; gelu_tanh f32 2"
// <dtype> is the instruction result's dtype (the plan's names: f32, f64, bf16, f16).
//
// Header-only, standard library only: the dialect's verifier and the runtime's contract parse it
// with the same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dgemma::fused {

// The ops a program may hold, with the arity of each.
enum class Opcode { Add, Sub, Mul, Div, Maximum, Minimum, Neg, Exp, Log, Tanh, Sqrt, Rsqrt, GeluTanh, Cast, Select };

struct OpcodeInfo {
  Opcode opcode;
  const char* name;  // the kernel name of the op the instruction stands for
  int arity;
};

inline constexpr OpcodeInfo kOpcodes[] = {
    {Opcode::Add, "add", 2},          {Opcode::Sub, "sub", 2},         {Opcode::Mul, "mul", 2},
    {Opcode::Div, "div", 2},          {Opcode::Maximum, "maximum", 2}, {Opcode::Minimum, "minimum", 2},
    {Opcode::Neg, "neg", 1},          {Opcode::Exp, "exp", 1},         {Opcode::Log, "log", 1},
    {Opcode::Tanh, "tanh", 1},        {Opcode::Sqrt, "sqrt", 1},       {Opcode::Rsqrt, "rsqrt", 1},
    {Opcode::GeluTanh, "gelu_tanh", 1}, {Opcode::Cast, "cast", 1},     {Opcode::Select, "select", 3},
};

inline std::optional<OpcodeInfo> opcodeNamed(std::string_view name) {
  for (const OpcodeInfo& info : kOpcodes)
    if (name == info.name) return info;
  return std::nullopt;
}

inline const OpcodeInfo& infoOf(Opcode opcode) { return kOpcodes[static_cast<size_t>(opcode)]; }

struct Instruction {
  Opcode opcode = Opcode::Add;
  std::string dtype;            // of the value it defines
  std::vector<int64_t> args;    // value numbers, each below inputs + this instruction's index
};

struct Program {
  std::vector<Instruction> instructions;
};

// Parses `text` for an op with `inputs` inputs. Checks the syntax, each op's arity and that every
// argument names an input or an earlier instruction; dtypes are checked by the caller, which knows
// the operands' types. On failure returns nullopt and sets `error` to what is wrong and where
// (the instruction's position, counted from 0).
inline std::optional<Program> parseProgram(std::string_view text, int64_t inputs, std::string& error) {
  Program program;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(';', begin), text.size());
    std::string_view line = text.substr(begin, end - begin);
    const std::string where = "instruction " + std::to_string(program.instructions.size()) + " ('" +
                              std::string(line) + "'): ";
    std::vector<std::string_view> words;
    for (size_t at = 0; at < line.size();) {
      if (line[at] == ' ') { ++at; continue; }
      const size_t next = std::min(line.find(' ', at), line.size());
      words.push_back(line.substr(at, next - at));
      at = next;
    }
    if (words.size() < 2) {
      error = where + "expected '<op> <dtype> <value>...'";
      return std::nullopt;
    }
    const std::optional<OpcodeInfo> info = opcodeNamed(words[0]);
    if (!info) {
      error = where + "unknown op '" + std::string(words[0]) + "'";
      return std::nullopt;
    }
    if (static_cast<int>(words.size()) - 2 != info->arity) {
      error = where + "'" + info->name + "' takes " + std::to_string(info->arity) + " values, got " +
              std::to_string(words.size() - 2);
      return std::nullopt;
    }
    Instruction instruction{info->opcode, std::string(words[1]), {}};
    const int64_t defined = inputs + static_cast<int64_t>(program.instructions.size());
    for (size_t w = 2; w < words.size(); ++w) {
      int64_t value = 0;
      bool digits = !words[w].empty() && words[w].size() <= 9;
      for (char c : words[w]) {
        digits = digits && c >= '0' && c <= '9';
        value = value * 10 + (c - '0');
      }
      if (!digits || value >= defined) {
        error = where + "value '" + std::string(words[w]) + "' is not an input or an earlier instruction (expected 0 to " +
                std::to_string(defined - 1) + ")";
        return std::nullopt;
      }
      instruction.args.push_back(value);
    }
    program.instructions.push_back(std::move(instruction));
    begin = end + 1;
  }
  return program;
}

// The dtype of every value of `program` (its inputs' `inputDTypes` first, each f32, f64, bf16, f16
// or bool), after checking the types: an instruction's dtype is f32, f64, bf16 or f16; a binary or
// unary op reads values of its dtype, a cast any float, a select (bool, dtype, dtype); f64 is not
// mixed with the other floats (one kernel computes in f64 or in f32); every value but the last is
// read. On failure returns nullopt and sets `error`.
inline std::optional<std::vector<std::string>> valueDTypes(const Program& program,
                                                           const std::vector<std::string>& inputDTypes,
                                                           std::string& error) {
  std::vector<std::string> dtypes = inputDTypes;
  std::vector<bool> used(inputDTypes.size() + program.instructions.size(), false);
  for (size_t index = 0; index < program.instructions.size(); ++index) {
    const Instruction& instruction = program.instructions[index];
    const std::string& dtype = instruction.dtype;
    const std::string where = "instruction " + std::to_string(index) + " (" + infoOf(instruction.opcode).name + " " +
                              dtype + "): ";
    if (dtype != "f32" && dtype != "f64" && dtype != "bf16" && dtype != "f16") {
      error = where + "expected dtype f32, f64, bf16 or f16";
      return std::nullopt;
    }
    std::vector<std::string> args;
    for (int64_t arg : instruction.args) {
      args.push_back(dtypes[arg]);
      used[arg] = true;
    }
    if (instruction.opcode == Opcode::Cast) {
      if (args[0] == "bool") {
        error = where + "casts a float, got bool";
        return std::nullopt;
      }
    } else if (instruction.opcode == Opcode::Select) {
      if (args[0] != "bool" || args[1] != dtype || args[2] != dtype) {
        error = where + "expected (bool, " + dtype + ", " + dtype + ") values, got (" + args[0] + ", " + args[1] + ", " +
                args[2] + ")";
        return std::nullopt;
      }
    } else {
      for (const std::string& arg : args)
        if (arg != dtype) {
          error = where + "expected " + dtype + " values, got " + arg;
          return std::nullopt;
        }
    }
    dtypes.push_back(dtype);
  }
  bool f64 = false, narrower = false;
  for (const std::string& dtype : dtypes) {
    f64 = f64 || dtype == "f64";
    narrower = narrower || (dtype != "f64" && dtype != "bool");
  }
  if (f64 && narrower) {
    error = "mixes f64 with 32- or 16-bit float values";
    return std::nullopt;
  }
  for (size_t value = 0; value + 1 < used.size(); ++value)
    if (!used[value]) {
      error = "value " + std::to_string(value) + " is never read";
      return std::nullopt;
    }
  return dtypes;
}

// The text parseProgram reads back.
inline std::string printProgram(const Program& program) {
  std::string text;
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& instruction = program.instructions[i];
    text += (i == 0 ? "" : "; ") + std::string(infoOf(instruction.opcode).name) + " " + instruction.dtype;
    for (int64_t arg : instruction.args) text += " " + std::to_string(arg);
  }
  return text;
}

}  // namespace dgemma::fused
