#ifndef DIALECTS_DG_IR_DGATTRS_H
#define DIALECTS_DG_IR_DGATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"

#include "dialects/dg/IR/DgEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/dg/IR/DgAttrs.h.inc"

#endif
