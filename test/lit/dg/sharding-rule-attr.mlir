// RUN: dgemma-opt %s --split-input-file --verify-diagnostics | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --verify-diagnostics | dgemma-opt --split-input-file | FileCheck %s
// #dg.sharding_rule parses, prints in its canonical form (factors named i, j, ... in the order of
// their sizes) and parses again; malformed rules are rejected with what is wrong.

// CHECK-LABEL: func.func @matmul
// CHECK-SAME: rule = #dg.sharding_rule<([i, j, l], [l, k]) -> ([i, j, k]) {i=2, j=4, k=16, l=8} reduction={l}>
func.func @matmul() attributes {rule = #dg.sharding_rule<([i, j, l], [l, k]) -> ([i, j, k]) {i=2, j=4, k=16, l=8} reduction={l}>} {
  return
}

// -----

// A dimension of several factors, major to minor; a size-1 dimension without one; kinds in either
// order; factors renamed to canonical names.
// CHECK-LABEL: func.func @products
// CHECK-SAME: rule = #dg.sharding_rule<([i, (j k)], [k, 1, l]) -> ([i, (j l)]) {i=4, j=2, k=8, l=16} reduction={k} need_replication={i}>
func.func @products() attributes {rule = #dg.sharding_rule<([batch, (group head)], [head, 1, width]) -> ([batch, (group width)]) {batch=4, group=2, head=8, width=16} need_replication={batch} reduction={head}>} {
  return
}

// -----

// No operands, a rank-0 result, no factors.
// CHECK-LABEL: func.func @scalar_source
// CHECK-SAME: rule = #dg.sharding_rule<() -> ([]) {}>
func.func @scalar_source() attributes {rule = #dg.sharding_rule<() -> ([]) {}>} {
  return
}

// -----

// Past z the names go on as z_1, z_2, ...
// CHECK-LABEL: func.func @many_factors
// CHECK-SAME: #dg.sharding_rule<([i, j, k, l, m, n, o, p, q, r, s, t, u, v, w, x, y, z, z_1, z_2]) -> ([i, j, k, l, m, n, o, p, q, r, s, t, u, v, w, x, y, z, z_1, z_2]) {i=1, j=1, k=1, l=1, m=1, n=1, o=1, p=1, q=1, r=1, s=1, t=1, u=1, v=1, w=1, x=1, y=1, z=1, z_1=1, z_2=2}>
func.func @many_factors() attributes {rule = #dg.sharding_rule<([a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9]) -> ([a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9]) {a0=1, a1=1, a2=1, a3=1, a4=1, a5=1, a6=1, a7=1, a8=1, a9=1, b0=1, b1=1, b2=1, b3=1, b4=1, b5=1, b6=1, b7=1, b8=1, b9=2}>} {
  return
}

// -----

// On its own (for debugging), one operand's or result's factors are index lists per dimension.
// CHECK-LABEL: func.func @tensor_factors
// CHECK-SAME: a = #dg.tensor_factors<{{\[\[0\], \[\], \[1, 2\]\]}}>, b = #dg.tensor_factors<>
func.func @tensor_factors() attributes {a = #dg.tensor_factors<[[0], [], [1, 2]]>, b = #dg.tensor_factors<>} {
  return
}

// -----

// expected-error @+1 {{factor 'k' has no size}}
func.func @unknown_factor() attributes {rule = #dg.sharding_rule<([i, k]) -> ([i]) {i=2}>}

// -----

// expected-error @+1 {{factor 'i' has two sizes}}
func.func @two_sizes() attributes {rule = #dg.sharding_rule<([i]) -> ([i]) {i=2, i=4}>}

// -----

// expected-error @+1 {{factor 'i' must have a size >= 1, got 0}}
func.func @zero_size() attributes {rule = #dg.sharding_rule<([i]) -> ([i]) {i=0}>}

// -----

// expected-error @+1 {{a dimension without factors is written 1, got 2}}
func.func @literal_size() attributes {rule = #dg.sharding_rule<([i, 2]) -> ([i]) {i=2}>}

// -----

// expected-error @+1 {{factor 'i' appears twice in operand 0}}
func.func @repeated_factor() attributes {rule = #dg.sharding_rule<([i, i]) -> ([i]) {i=2}>}

// -----

// expected-error @+1 {{factor 'j' appears in no operand or result}}
func.func @unused_factor() attributes {rule = #dg.sharding_rule<([i]) -> ([i]) {i=2, j=3}>}

// -----

// expected-error @+1 {{factor 'j' is given two kinds}}
func.func @two_kinds() attributes {rule = #dg.sharding_rule<([i, j]) -> ([i]) {i=2, j=3} reduction={j} need_replication={j}>}

// -----

// A factor that a result lacks hides a sum over it.
// expected-error @+1 {{pass-through factor 'j' must appear in every result (one that a result lacks is a reduction)}}
func.func @hidden_reduction() attributes {rule = #dg.sharding_rule<([i, j]) -> ([i]) {i=2, j=3}>}

// -----

// expected-error @+1 {{reduction factor 'i' must appear in an operand and be missing from a result}}
func.func @reduction_kept() attributes {rule = #dg.sharding_rule<([i]) -> ([i]) {i=2} reduction={i}>}

// -----

// expected-error @+1 {{expected '->'}}
func.func @no_arrow() attributes {rule = #dg.sharding_rule<([i]) ([i]) {i=2}>}
