#ifndef DIALECTS_DG_IR_DGINTERFACES_H
#define DIALECTS_DG_IR_DGINTERFACES_H

#include "dialects/dg/IR/DgAttrs.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"

#include "dialects/dg/IR/DgInterfaces.h.inc"

#endif
