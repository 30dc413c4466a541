// The dialect's attributes (DgAttrs.td): the enums, and the sharding rule's syntax and verifiers.
#include "dialects/dg/IR/DgAttrs.h"

#include "dialects/dg/IR/DgDialect.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/Operation.h"

using namespace mlir;
using namespace mlir::dg;

#include "dialects/dg/IR/DgEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/dg/IR/DgAttrs.cpp.inc"

void DgDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/dg/IR/DgAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// #dg.sharding_rule syntax
//===----------------------------------------------------------------------===//

namespace {

// i, j, ..., z, then z_1, z_2, ...: single letters keep the common rules short, and none of the
// names lexes as a type (i32) or keyword (f32).
std::string factorName(int64_t factor) {
  constexpr int64_t kLetters = 'z' - 'i' + 1;
  if (factor < kLetters) return std::string(1, static_cast<char>('i' + factor));
  return "z_" + std::to_string(factor - kLetters + 1);
}

constexpr std::pair<FactorKind, StringLiteral> kListedKinds[] = {
    {FactorKind::Reduction, "reduction"},
    {FactorKind::NeedReplication, "need_replication"},
};

void printTensors(AsmPrinter& printer, ArrayRef<TensorFactorsAttr> tensors) {
  printer << "(";
  llvm::interleaveComma(tensors, printer, [&](TensorFactorsAttr tensor) {
    printer << "[";
    llvm::interleaveComma(tensor.getDims(), printer, [&](DenseI64ArrayAttr dim) {
      ArrayRef<int64_t> factors = dim.asArrayRef();
      if (factors.empty()) printer << "1";
      else if (factors.size() == 1) printer << factorName(factors[0]);
      else {
        printer << "(";
        llvm::interleave(factors, printer, [&](int64_t factor) { printer << factorName(factor); }, " ");
        printer << ")";
      }
    });
    printer << "]";
  });
  printer << ")";
}

// A factor name as written, resolved to an index once the sizes have been read.
struct NameUse {
  std::string name;
  SMLoc loc;
};
using ParsedTensor = SmallVector<SmallVector<NameUse>>;

ParseResult parseFactorName(AsmParser& parser, SmallVectorImpl<NameUse>& names) {
  NameUse use{{}, parser.getCurrentLocation()};
  if (parser.parseKeywordOrString(&use.name)) return failure();
  names.push_back(std::move(use));
  return success();
}

// `1`, a factor name, or `(name name ...)`.
ParseResult parseDim(AsmParser& parser, SmallVector<NameUse>& factors) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t size;
  OptionalParseResult integer = parser.parseOptionalInteger(size);
  if (integer.has_value()) {
    if (failed(*integer)) return failure();
    if (size != 1) return parser.emitError(loc) << "a dimension without factors is written 1, got " << size;
    return success();
  }
  if (failed(parser.parseOptionalLParen())) return parseFactorName(parser, factors);
  do {
    if (parseFactorName(parser, factors)) return failure();
  } while (failed(parser.parseOptionalRParen()));
  return success();
}

ParseResult parseTensors(AsmParser& parser, SmallVectorImpl<ParsedTensor>& tensors) {
  return parser.parseCommaSeparatedList(AsmParser::Delimiter::Paren, [&]() -> ParseResult {
    ParsedTensor& tensor = tensors.emplace_back();
    return parser.parseCommaSeparatedList(AsmParser::Delimiter::Square,
                                          [&]() { return parseDim(parser, tensor.emplace_back()); });
  });
}

}  // namespace

void ShardingRuleAttr::print(AsmPrinter& printer) const {
  printer << "<";
  printTensors(printer, getOperands());
  printer << " -> ";
  printTensors(printer, getResults());
  printer << " {";
  for (int64_t factor = 0; factor < getNumFactors(); ++factor)
    printer << (factor ? ", " : "") << factorName(factor) << "=" << getFactorSizes()[factor];
  printer << "}";
  for (auto [kind, keyword] : kListedKinds) {
    SmallVector<std::string> names;
    for (int64_t factor = 0; factor < getNumFactors(); ++factor)
      if (getFactorKinds()[factor] == kind) names.push_back(factorName(factor));
    if (names.empty()) continue;
    printer << " " << keyword << "={";
    llvm::interleaveComma(names, printer);
    printer << "}";
  }
  printer << ">";
}

Attribute ShardingRuleAttr::parse(AsmParser& parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  SmallVector<ParsedTensor> operands, results;
  if (parser.parseLess() || parseTensors(parser, operands) || parser.parseArrow() || parseTensors(parser, results))
    return {};

  // The sizes, `{name=size, ...}`, define the factors in order.
  llvm::StringMap<int64_t> indexOf;
  SmallVector<int64_t> sizes;
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Braces, [&]() -> ParseResult {
        SMLoc loc = parser.getCurrentLocation();
        std::string name;
        int64_t size;
        if (parser.parseKeywordOrString(&name) || parser.parseEqual() || parser.parseInteger(size)) return failure();
        if (!indexOf.try_emplace(name, sizes.size()).second)
          return parser.emitError(loc) << "factor '" << name << "' has two sizes";
        sizes.push_back(size);
        return success();
      }))
    return {};
  auto resolve = [&](const NameUse& use) -> FailureOr<int64_t> {
    auto found = indexOf.find(use.name);
    if (found == indexOf.end()) return parser.emitError(use.loc) << "factor '" << use.name << "' has no size";
    return found->second;
  };

  // Then `reduction={...}` and `need_replication={...}`, in either order.
  SmallVector<FactorKind> kinds(sizes.size(), FactorKind::PassThrough);
  StringRef keyword;
  while (succeeded(parser.parseOptionalKeyword(&keyword, {kListedKinds[0].second, kListedKinds[1].second}))) {
    FactorKind kind = keyword == kListedKinds[0].second ? kListedKinds[0].first : kListedKinds[1].first;
    SmallVector<NameUse> names;
    if (parser.parseEqual() ||
        parser.parseCommaSeparatedList(AsmParser::Delimiter::Braces, [&]() { return parseFactorName(parser, names); }))
      return {};
    for (const NameUse& use : names) {
      FailureOr<int64_t> factor = resolve(use);
      if (failed(factor)) return {};
      if (kinds[*factor] != FactorKind::PassThrough) {
        parser.emitError(use.loc) << "factor '" << use.name << "' is given two kinds";
        return {};
      }
      kinds[*factor] = kind;
    }
  }
  if (parser.parseGreater()) return {};

  MLIRContext* context = parser.getContext();
  auto build = [&](ArrayRef<ParsedTensor> parsed) -> FailureOr<SmallVector<TensorFactorsAttr>> {
    SmallVector<TensorFactorsAttr> tensors;
    for (const ParsedTensor& tensor : parsed) {
      SmallVector<DenseI64ArrayAttr> dims;
      for (const SmallVector<NameUse>& dim : tensor) {
        SmallVector<int64_t> factors;
        for (const NameUse& use : dim) {
          FailureOr<int64_t> factor = resolve(use);
          if (failed(factor)) return failure();
          factors.push_back(*factor);
        }
        dims.push_back(DenseI64ArrayAttr::get(context, factors));
      }
      tensors.push_back(TensorFactorsAttr::get(context, dims));
    }
    return tensors;
  };
  FailureOr<SmallVector<TensorFactorsAttr>> operandFactors = build(operands), resultFactors = build(results);
  if (failed(operandFactors) || failed(resultFactors)) return {};
  return parser.getChecked<ShardingRuleAttr>(start, context, sizes, kinds, *operandFactors, *resultFactors);
}

//===----------------------------------------------------------------------===//
// Verification
//===----------------------------------------------------------------------===//

LogicalResult ShardingRuleAttr::verify(function_ref<InFlightDiagnostic()> emitError, ArrayRef<int64_t> factorSizes,
                                       ArrayRef<FactorKind> factorKinds, ArrayRef<TensorFactorsAttr> operands,
                                       ArrayRef<TensorFactorsAttr> results) {
  int64_t numFactors = factorSizes.size();
  if (factorKinds.size() != factorSizes.size())
    return emitError() << "sharding rule has " << numFactors << " factor sizes but " << factorKinds.size() << " kinds";
  for (int64_t factor = 0; factor < numFactors; ++factor)
    if (factorSizes[factor] < 1)
      return emitError() << "factor '" << factorName(factor) << "' must have a size >= 1, got " << factorSizes[factor];

  // Which tensors hold each factor; a factor names at most one dimension of a tensor.
  SmallVector<int64_t> inOperands(numFactors, 0), inResults(numFactors, 0);
  auto count = [&](ArrayRef<TensorFactorsAttr> tensors, StringRef role, SmallVectorImpl<int64_t>& uses) -> LogicalResult {
    for (auto [index, tensor] : llvm::enumerate(tensors)) {
      SmallVector<bool> seen(numFactors, false);
      for (int64_t dim = 0; dim < tensor.getRank(); ++dim)
        for (int64_t factor : tensor.getDimFactors(dim)) {
          if (factor < 0 || factor >= numFactors)
            return emitError() << role << " " << index << " dimension " << dim << " names factor " << factor
                               << ", but the rule has " << numFactors << " factors";
          if (seen[factor])
            return emitError() << "factor '" << factorName(factor) << "' appears twice in " << role << " " << index;
          seen[factor] = true;
          ++uses[factor];
        }
    }
    return success();
  };
  if (failed(count(operands, "operand", inOperands)) || failed(count(results, "result", inResults))) return failure();

  int64_t numResults = results.size();
  for (int64_t factor = 0; factor < numFactors; ++factor) {
    std::string name = factorName(factor);
    if (inOperands[factor] + inResults[factor] == 0)
      return emitError() << "factor '" << name << "' appears in no operand or result";
    // A pass-through factor that a result lacks would hide a sum over it: that is a reduction.
    if (factorKinds[factor] == FactorKind::PassThrough && inResults[factor] != numResults && inOperands[factor] > 0)
      return emitError() << "pass-through factor '" << name << "' must appear in every result (one that a result "
                            "lacks is a reduction)";
    if (factorKinds[factor] == FactorKind::Reduction && (inOperands[factor] == 0 || inResults[factor] == numResults))
      return emitError() << "reduction factor '" << name << "' must appear in an operand and be missing from a result";
  }
  return success();
}

LogicalResult ShardingRuleAttr::verifyShapes(Operation* op) const {
  auto check = [&](ArrayRef<TensorFactorsAttr> tensors, TypeRange types, StringRef role) -> LogicalResult {
    if (tensors.size() != types.size())
      return op->emitOpError() << "sharding rule has " << tensors.size() << " " << role << "s, the op " << types.size();
    for (auto [index, tensor, type] : llvm::enumerate(tensors, types)) {
      auto ranked = llvm::dyn_cast<RankedTensorType>(type);
      if (!ranked || ranked.getRank() != tensor.getRank())
        return op->emitOpError() << "sharding rule gives " << role << " " << index << " rank " << tensor.getRank()
                                 << ", its type is " << type;
      for (int64_t dim = 0; dim < tensor.getRank(); ++dim) {
        int64_t product = 1;
        for (int64_t factor : tensor.getDimFactors(dim)) product *= getFactorSizes()[factor];
        if (product != ranked.getDimSize(dim))
          return op->emitOpError() << "sharding rule: the factors of " << role << " " << index << " dimension " << dim
                                   << " multiply to " << product << ", the dimension is " << ranked.getDimSize(dim);
      }
    }
    return success();
  };
  return failure(failed(check(getOperands(), op->getOperandTypes(), "operand")) ||
                 failed(check(getResults(), op->getResultTypes(), "result")));
}

//===----------------------------------------------------------------------===//
// #dg.sharding
//===----------------------------------------------------------------------===//

ShardingAttr ShardingAttr::replicated(MLIRContext* context, int64_t rank) {
  SmallVector<ArrayAttr> dims(rank, ArrayAttr::get(context, {}));
  return ShardingAttr::get(context, dims, ArrayRef<StringAttr>());
}

ShardingAttr ShardingAttr::get(MLIRContext* context, ArrayRef<SmallVector<StringRef>> dims, ArrayRef<StringRef> partial) {
  auto axisList = [&](ArrayRef<StringRef> names) {
    SmallVector<Attribute> axes;
    for (StringRef name : names) axes.push_back(StringAttr::get(context, name));
    return ArrayAttr::get(context, axes);
  };
  SmallVector<ArrayAttr> dimAttrs;
  for (const SmallVector<StringRef>& dim : dims) dimAttrs.push_back(axisList(dim));
  SmallVector<StringAttr> partialAttrs;
  for (StringRef name : partial) partialAttrs.push_back(StringAttr::get(context, name));
  return ShardingAttr::get(context, dimAttrs, partialAttrs);
}

SmallVector<StringRef> ShardingAttr::getDimAxes(int64_t dim) const {
  SmallVector<StringRef> axes;
  for (Attribute axis : getDims()[dim]) axes.push_back(llvm::cast<StringAttr>(axis).getValue());
  return axes;
}

SmallVector<StringRef> ShardingAttr::getPartialAxes() const {
  SmallVector<StringRef> axes;
  for (StringAttr axis : getPartial()) axes.push_back(axis.getValue());
  return axes;
}

SmallVector<StringRef> ShardingAttr::getUsedAxes() const {
  SmallVector<StringRef> axes;
  for (int64_t dim = 0; dim < getRank(); ++dim) llvm::append_range(axes, getDimAxes(dim));
  llvm::append_range(axes, getPartialAxes());
  return axes;
}

bool ShardingAttr::isReplicated() const {
  return getPartial().empty() && llvm::all_of(getDims(), [](ArrayAttr dim) { return dim.empty(); });
}

namespace {
void printAxisList(AsmPrinter& printer, ArrayRef<StringRef> axes) {
  printer << "[";
  llvm::interleaveComma(axes, printer, [&](StringRef axis) { printer.printKeywordOrString(axis); });
  printer << "]";
}

ParseResult parseAxisList(AsmParser& parser, SmallVectorImpl<std::string>& names) {
  return parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&]() -> ParseResult {
    return parser.parseKeywordOrString(&names.emplace_back());
  });
}
}  // namespace

void ShardingAttr::print(AsmPrinter& printer) const {
  printer << "<[";
  for (int64_t dim = 0; dim < getRank(); ++dim) {
    if (dim) printer << ", ";
    printAxisList(printer, getDimAxes(dim));
  }
  printer << "]";
  if (!getPartial().empty()) {
    printer << ", partial = ";
    printAxisList(printer, getPartialAxes());
  }
  printer << ">";
}

Attribute ShardingAttr::parse(AsmParser& parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  MLIRContext* context = parser.getContext();
  auto toAttr = [&](ArrayRef<std::string> names) {
    SmallVector<Attribute> axes;
    for (const std::string& name : names) axes.push_back(StringAttr::get(context, name));
    return axes;
  };
  SmallVector<ArrayAttr> dims;
  if (parser.parseLess() || parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&]() -> ParseResult {
        SmallVector<std::string> names;
        if (parseAxisList(parser, names)) return failure();
        dims.push_back(ArrayAttr::get(context, toAttr(names)));
        return success();
      }))
    return {};
  SmallVector<StringAttr> partial;
  if (succeeded(parser.parseOptionalComma())) {
    SmallVector<std::string> names;
    if (parser.parseKeyword("partial") || parser.parseEqual() || parseAxisList(parser, names)) return {};
    for (const std::string& name : names) partial.push_back(StringAttr::get(context, name));
  }
  if (parser.parseGreater()) return {};
  return parser.getChecked<ShardingAttr>(start, context, dims, partial);
}

LogicalResult ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError, ArrayRef<ArrayAttr> dims,
                                   ArrayRef<StringAttr> partial) {
  llvm::StringSet<> seen;
  auto use = [&](Attribute axis) -> LogicalResult {
    auto name = llvm::dyn_cast<StringAttr>(axis);
    if (!name) return emitError() << "sharding axes must be names, got " << axis;
    if (!seen.insert(name.getValue()).second)
      return emitError() << "sharding uses mesh axis '" << name.getValue() << "' twice";
    return success();
  };
  for (ArrayAttr dim : dims)
    for (Attribute axis : dim)
      if (failed(use(axis))) return failure();
  for (StringAttr axis : partial)
    if (failed(use(axis))) return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// #dg.mesh syntax: `<[name = size (role), ...]>`
//===----------------------------------------------------------------------===//

void MeshAttr::print(AsmPrinter& printer) const {
  printer << "<[";
  llvm::interleaveComma(getAxes(), printer, [&](MeshAxisAttr axis) {
    printer.printKeywordOrString(axis.getName());
    printer << " = " << axis.getSize() << " (" << stringifyAxisRole(axis.getRole()) << ")";
  });
  printer << "]>";
}

Attribute MeshAttr::parse(AsmParser& parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  MLIRContext* context = parser.getContext();
  SmallVector<MeshAxisAttr> axes;
  if (parser.parseLess() ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square,
                                     [&]() -> ParseResult {
                                       std::string name;
                                       int64_t size;
                                       StringRef roleName;
                                       if (parser.parseKeywordOrString(&name) || parser.parseEqual() ||
                                           parser.parseInteger(size) || parser.parseLParen())
                                         return failure();
                                       SMLoc roleLoc = parser.getCurrentLocation();
                                       if (parser.parseKeyword(&roleName)) return failure();
                                       std::optional<AxisRole> role = symbolizeAxisRole(roleName);
                                       if (!role)
                                         return parser.emitError(roleLoc)
                                                << "axis '" << name << "' has role '" << roleName
                                                << "', expected data, expert, tensor or context";
                                       if (parser.parseRParen()) return failure();
                                       axes.push_back(MeshAxisAttr::get(context, name, size, *role));
                                       return success();
                                     }) ||
      parser.parseGreater())
    return {};
  return parser.getChecked<MeshAttr>(start, context, axes);
}

LogicalResult MeshAttr::verify(function_ref<InFlightDiagnostic()> emitError, ArrayRef<MeshAxisAttr> axes) {
  llvm::StringSet<> seen;
  for (MeshAxisAttr axis : axes) {
    if (axis.getName().empty()) return emitError() << "mesh axis names must not be empty";
    if (!seen.insert(axis.getName()).second)
      return emitError() << "mesh axis '" << axis.getName() << "' is listed twice";
    if (axis.getSize() < 1)
      return emitError() << "mesh axis '" << axis.getName() << "' has size " << axis.getSize() << ", expected >= 1";
  }
  return success();
}
