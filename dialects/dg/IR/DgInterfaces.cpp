#include "dialects/dg/IR/DgInterfaces.h"

#include "dialects/dg/IR/DgInterfaces.cpp.inc"
