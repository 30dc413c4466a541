// RUN: dgemma-opt %s --dg-memory-plan --split-input-file | FileCheck %s
// RUN: dgemma-opt %s --dg-memory-plan=stats=true --split-input-file 2>&1 >/dev/null | FileCheck %s --check-prefix=STATS

// A chain: each value dies when the next op has read it, so buffers ping-pong. Both packings need
// two buffers, as many as are ever live at once: no fragmentation.
// STATS: remark: memory plan: activations values=4 bytes=128 largest_first=128 best_fit=128 max_live=128 fragmentation=1.000; communication values=0 bytes=0 largest_first=0 best_fit=0 max_live=0 fragmentation=1.000;
// CHECK-LABEL: func.func @chain
// CHECK-SAME: dg.comm_buffer_bytes = 0
// CHECK-SAME: dg.scratch_bytes = 128
func.func @chain() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<16xf32>
  // CHECK: dg.exp %{{.*}} {dg.offsets = array<i64: 64>}
  %a = dg.exp %x : tensor<16xf32>
  // CHECK: dg.tanh %{{.*}} {dg.offsets = array<i64: 0>}
  %b = dg.tanh %a : tensor<16xf32>
  // CHECK: dg.neg %{{.*}} {dg.offsets = array<i64: 64>}
  %c = dg.neg %b : tensor<16xf32>
  dg.output "c", %c : tensor<16xf32>
  return
}

// -----

// An input stays live until its last reader, outputs until the end; parameters and constants are
// persistent (no offset); a reshape shares its input's bytes.
// CHECK-LABEL: func.func @lifetimes
// CHECK-SAME: dg.scratch_bytes = 192
func.func @lifetimes() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: [[X:[0-9]+]]>}
  %x = dg.input "x" : tensor<4x4xf32>
  // CHECK: dg.param "w" : tensor<4x4xf32>
  %w = dg.param "w" : tensor<4x4xf32>
  // CHECK: dg.constant dense
  %c = dg.constant dense<1.0> : tensor<4x4xf32>
  // CHECK: dg.add {{.*}} {dg.offsets = array<i64: [[A:[0-9]+]]>}
  %a = dg.add %x, %w : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  // CHECK: dg.reshape {{.*}} {dg.offsets = array<i64: [[A]]>}
  %r = dg.reshape %a : tensor<4x4xf32> -> tensor<16xf32>
  // CHECK: dg.mul {{.*}} {dg.offsets = array<i64: [[M:[0-9]+]]>}
  %m = dg.mul %x, %c : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  dg.output "r", %r : tensor<16xf32>
  dg.output "m", %m : tensor<4x4xf32>
  return
}

// -----

// Larger values are placed first, each at the lowest free offset: the fill reuses the input's
// bytes (the input died at the reduction), the sum must avoid the fill (both live at the add), and
// the scalar, live across all of them, goes last. Best-fit in program order needs as much (the
// scalar takes the bytes after the input, the sum those after it), so largest-first's offsets stay.
// STATS: remark: memory plan: activations values=4 bytes=1088 largest_first=1088 best_fit=1088 max_live=1088
// CHECK-LABEL: func.func @largest_first
// CHECK-SAME: dg.scratch_bytes = 1088
func.func @largest_first() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<128xf32>
  // CHECK: dg.reduce_sum {{.*}} {dg.offsets = array<i64: 1024>}
  %s = dg.reduce_sum %x dims = [0] : tensor<128xf32> -> tensor<f32>
  // CHECK: dg.fill {{.*}} {dg.offsets = array<i64: 0>}
  %big = dg.fill 1.0 : tensor<128xf32>
  // CHECK: dg.add {{.*}} {dg.offsets = array<i64: 512>}
  %y = dg.add %big, %s : tensor<128xf32>, tensor<f32> -> tensor<128xf32>
  dg.output "y", %y : tensor<128xf32>
  return
}

// -----

// stop_gradient is a view like reshape: it shares its input's bytes, and a read of the view keeps
// them alive (the tanh cannot take the exp's bytes).
// CHECK-LABEL: func.func @stop_gradient_view
// CHECK-SAME: dg.scratch_bytes = 192
func.func @stop_gradient_view() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<16xf32>
  // CHECK: dg.exp {{.*}} {dg.offsets = array<i64: 64>}
  %e = dg.exp %x : tensor<16xf32>
  // CHECK: dg.stop_gradient {{.*}} {dg.offsets = array<i64: 64>}
  %s = dg.stop_gradient %e : tensor<16xf32>
  // CHECK: dg.tanh {{.*}} {dg.offsets = array<i64: 128>}
  %t = dg.tanh %x : tensor<16xf32>
  // CHECK: dg.add {{.*}} {dg.offsets = array<i64: 0>}
  %a = dg.add %s, %t : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  dg.output "a", %a : tensor<16xf32>
  return
}

// -----

// An all-reduce whose input has no other reader works in place.
module attributes {dg.mesh = #dg.mesh<[tp = 1 (tensor)]>} {
// CHECK-LABEL: func.func @in_place_all_reduce
func.func @in_place_all_reduce() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<16xf32>
  // CHECK: dg.exp {{.*}} {dg.offsets = array<i64: [[E:[0-9]+]]>}
  %e = dg.exp %x : tensor<16xf32>
  // CHECK: dg.all_reduce {{.*}} {dg.offsets = array<i64: [[E]]>}
  %r = dg.all_reduce %e axis = "tp" : tensor<16xf32> -> tensor<16xf32>
  dg.output "r", %r : tensor<16xf32>
  return
}
}

// -----

// An all-reduce of a reshape (a view) of a value that is read elsewhere must not overwrite it: it
// gets its own bytes.
module attributes {dg.mesh = #dg.mesh<[tp = 1 (tensor)]>} {
// CHECK-LABEL: func.func @all_reduce_of_a_shared_view
func.func @all_reduce_of_a_shared_view() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<16xf32>
  %e = dg.exp %x : tensor<16xf32>
  %v = dg.reshape %e : tensor<16xf32> -> tensor<4x4xf32>
  // CHECK: dg.exp {{.*}} {dg.offsets = array<i64: 64>}
  // CHECK: dg.all_reduce {{.*}} {dg.offsets = array<i64: 0>}
  %r = dg.all_reduce %v axis = "tp" : tensor<4x4xf32> -> tensor<4x4xf32>
  %n = dg.neg %e : tensor<16xf32>
  dg.output "r", %r : tensor<4x4xf32>
  dg.output "n", %n : tensor<16xf32>
  return
}
}

// -----

// A broadcast and a reduce_to_root work in place like an all-reduce, but never in a parameter's
// persistent bytes: that result gets scratch of its own (the plan copies the parameter into it).
module attributes {dg.mesh = #dg.mesh<[tp = 1 (tensor)]>} {
// CHECK-LABEL: func.func @in_place_broadcast
func.func @in_place_broadcast() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<16xf32>
  %w = dg.param "w" : tensor<16xf32>
  // CHECK: dg.exp {{.*}} {dg.offsets = array<i64: [[E:[0-9]+]]>}
  %e = dg.exp %x : tensor<16xf32>
  // CHECK: dg.broadcast {{.*}} {dg.offsets = array<i64: [[E]]>}
  %b = dg.broadcast %e axis = "tp" root = 0 : tensor<16xf32> -> tensor<16xf32>
  // CHECK: dg.reduce_to_root {{.*}} {dg.offsets = array<i64: [[E]]>}
  %r = dg.reduce_to_root %b axis = "tp" root = 0 : tensor<16xf32> -> tensor<16xf32>
  // CHECK: dg.broadcast {{.*}} {dg.offsets = array<i64: [[W:[0-9]+]]>}
  %bw = dg.broadcast %w axis = "tp" root = 0 : tensor<16xf32> -> tensor<16xf32>
  dg.output "r", %r : tensor<16xf32>
  dg.output "bw", %bw : tensor<16xf32>
  return
}
}

// -----

// A gradient buffer that optimizer_step reads only through its reductions and zeroes after the
// last read of the sums is reduced in its own bytes: the all-reduces (one per axis) get no scratch
// (no dg.offsets) and the communication pool stays empty.
module attributes {dg.mesh = #dg.mesh<[cp = 2 (context), tp = 2 (tensor)]>} {
// CHECK-LABEL: func.func @all_reduce_into_a_gradient_buffer
// CHECK-SAME: dg.comm_buffer_bytes = 0
func.func @all_reduce_into_a_gradient_buffer() attributes {dg.entry = "optimizer_step"} {
  %g = dg.param "grad/w" : tensor<16xf32>
  // CHECK: dg.all_reduce %{{.*}} axis = "cp" : tensor<16xf32>
  %r = dg.all_reduce %g axis = "cp" : tensor<16xf32> -> tensor<16xf32>
  // CHECK: dg.all_reduce %{{.*}} axis = "tp" : tensor<16xf32>
  %t = dg.all_reduce %r axis = "tp" : tensor<16xf32> -> tensor<16xf32>
  %e = dg.exp %t : tensor<16xf32>
  dg.output "e", %e : tensor<16xf32>
  %z = dg.fill 0.0 : tensor<16xf32>
  dg.assign %z to %g : tensor<16xf32>
  return
}
}

// -----

// The same reduction gets bytes of its own when the entry reads the buffer elsewhere, when the sums
// are read after the buffer is overwritten, or when nothing overwrites it.
module attributes {dg.mesh = #dg.mesh<[cp = 2 (context)]>} {
// CHECK-LABEL: func.func @buffer_read_elsewhere
// CHECK-SAME: dg.comm_buffer_bytes = 64
func.func @buffer_read_elsewhere() attributes {dg.entry = "optimizer_step"} {
  %g = dg.param "grad/w" : tensor<16xf32>
  // CHECK: dg.all_reduce {{.*}} {dg.offsets = array<i64: 0>}
  %r = dg.all_reduce %g axis = "cp" : tensor<16xf32> -> tensor<16xf32>
  %n = dg.neg %g : tensor<16xf32>
  dg.output "r", %r : tensor<16xf32>
  dg.output "n", %n : tensor<16xf32>
  %z = dg.fill 0.0 : tensor<16xf32>
  dg.assign %z to %g : tensor<16xf32>
  return
}
// CHECK-LABEL: func.func @sums_outlive_the_buffer
// CHECK-SAME: dg.comm_buffer_bytes = 64
func.func @sums_outlive_the_buffer() attributes {dg.entry = "optimizer_step"} {
  %g = dg.param "grad/w" : tensor<16xf32>
  // CHECK: dg.all_reduce {{.*}} {dg.offsets = array<i64: 0>}
  %r = dg.all_reduce %g axis = "cp" : tensor<16xf32> -> tensor<16xf32>
  %z = dg.fill 0.0 : tensor<16xf32>
  dg.assign %z to %g : tensor<16xf32>
  dg.output "r", %r : tensor<16xf32>
  return
}
// CHECK-LABEL: func.func @buffer_kept
// CHECK-SAME: dg.comm_buffer_bytes = 64
func.func @buffer_kept() attributes {dg.entry = "optimizer_step"} {
  %g = dg.param "grad/w" : tensor<16xf32>
  // CHECK: dg.all_reduce {{.*}} {dg.offsets = array<i64: 0>}
  %r = dg.all_reduce %g axis = "cp" : tensor<16xf32> -> tensor<16xf32>
  %e = dg.exp %r : tensor<16xf32>
  dg.output "e", %e : tensor<16xf32>
  return
}
}

// -----

// An optimizer update assigned straight back is computed in its parameter's storage: no scratch for
// those results (-1); a result also read elsewhere keeps its own bytes (above the two inputs: every
// scratch value takes a whole 64-byte block, so the three tie and keep their program order).
// CHECK-LABEL: func.func @in_place_update
// CHECK-SAME: dg.scratch_bytes = 192
func.func @in_place_update() attributes {dg.entry = "optimizer_step"} {
  %s = dg.input "s" : tensor<f32>
  %g = dg.input "grad/w" : tensor<16xf32>
  %w = dg.param "w" : tensor<16xf32>
  %m = dg.param "optimizer/exp_avg/w" : tensor<16xf32>
  %v = dg.param "optimizer/exp_avg_sq/w" : tensor<16xf32>
  // CHECK: dg.adamw {{.*}} {beta1 = {{.*}}, dg.offsets = array<i64: -1, -1, 128>
  %nw, %nm, %nv = dg.adamw %w, %g, %m, %v, %s, %s, %s, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<16xf32>, tensor<f32>
  dg.assign %nw to %w : tensor<16xf32>
  dg.assign %nm to %m : tensor<16xf32>
  dg.assign %nv to %v : tensor<16xf32>
  dg.output "second_moment", %nv : tensor<16xf32>
  return
}

// -----

// A select that keeps a parameter on one side and is assigned back to it is computed in the
// parameter's bytes (the denoise entry's self-conditioning state): no scratch for it, so no offsets
// (the inputs and the exp take 192 bytes; the select's own result would need 64 more).
// CHECK-LABEL: func.func @in_place_select
// CHECK-SAME: dg.scratch_bytes = 192
func.func @in_place_select() attributes {dg.entry = "denoise"} {
  %keep = dg.input "keep" : tensor<2x1xi1>
  %x = dg.input "x" : tensor<2x8xf32>
  %state = dg.param "state" : tensor<2x8xf32>
  %read = dg.exp %state : tensor<2x8xf32>
  // CHECK: dg.select %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}} : tensor<2x1xi1>
  %next = dg.select %keep, %state, %x : tensor<2x1xi1>, tensor<2x8xf32>, tensor<2x8xf32> -> tensor<2x8xf32>
  dg.output "read", %read : tensor<2x8xf32>
  dg.assign %next to %state : tensor<2x8xf32>
  return
}

// -----

// A collective's own result (an all_gather, which cannot work in place) lives in the communication
// pool, at offsets of its own: the gathered rows take the communication arena, and the neg reuses
// the bytes of the input and the exp, both dead by then.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
// STATS: remark: memory plan: activations values=3 bytes=128 largest_first=128 best_fit=128 max_live=128 fragmentation=1.000; communication values=1 bytes=128 largest_first=128 best_fit=128 max_live=128 fragmentation=1.000;
// CHECK-LABEL: func.func @communication_pool
// CHECK-SAME: dg.comm_buffer_bytes = 128
// CHECK-SAME: dg.scratch_bytes = 128
func.func @communication_pool() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<16xf32>
  // CHECK: dg.exp {{.*}} {dg.offsets = array<i64: 64>}
  %e = dg.exp %x : tensor<16xf32>
  // CHECK: dg.all_gather {{.*}} {dg.offsets = array<i64: 0>}
  %g = dg.all_gather %e axis = "tp" : tensor<16xf32> -> tensor<32xf32>
  // CHECK: dg.neg {{.*}} {dg.offsets = array<i64: 0>}
  %n = dg.neg %g : tensor<32xf32>
  dg.output "n", %n : tensor<32xf32>
  return
}
}

// -----

// Where the packings differ, the smaller arena wins. Largest first puts the input and the fill
// (disjoint lifetimes, 256 bytes each) at offset 0, the slice above the input, and the exp, live
// with both the slice and the fill, above those: 640 bytes. Best-fit in program order gives the exp
// the input's freed bytes, and the fill the slice's freed bytes merged with the exp's leftover 64:
// 448 bytes, what the exp and the fill hold live together.
// STATS: remark: memory plan: activations values=4 bytes=448 largest_first=640 best_fit=448 max_live=448 fragmentation=1.000;
// CHECK-LABEL: func.func @best_fit_wins
// CHECK-SAME: dg.scratch_bytes = 448
func.func @best_fit_wins() attributes {dg.entry = "forward"} {
  // CHECK: dg.input "x" {dg.offsets = array<i64: 0>}
  %x = dg.input "x" : tensor<64xf32>
  // CHECK: dg.slice {{.*}} {dg.offsets = array<i64: 256>}
  %s = dg.slice %x dim = 0 start = 0 : tensor<64xf32> -> tensor<48xf32>
  // CHECK: dg.exp {{.*}} {dg.offsets = array<i64: 0>}
  %e = dg.exp %s : tensor<48xf32>
  // CHECK: dg.fill {{.*}} {dg.offsets = array<i64: 192>}
  %f = dg.fill 1.0 : tensor<64xf32>
  dg.output "e", %e : tensor<48xf32>
  dg.output "f", %f : tensor<64xf32>
  return
}

// -----

// The parameter is read after the select (before the assign): the select keeps scratch of its own.
// CHECK-LABEL: func.func @select_read_before_assign
func.func @select_read_before_assign() attributes {dg.entry = "denoise"} {
  %keep = dg.input "keep" : tensor<2x1xi1>
  %x = dg.input "x" : tensor<2x8xf32>
  %state = dg.param "state" : tensor<2x8xf32>
  // CHECK: dg.select {{.*}} {dg.offsets = array<i64: {{[0-9]+}}>}
  %next = dg.select %keep, %state, %x : tensor<2x1xi1>, tensor<2x8xf32>, tensor<2x8xf32> -> tensor<2x8xf32>
  %read = dg.exp %state : tensor<2x8xf32>
  dg.output "read", %read : tensor<2x8xf32>
  dg.assign %next to %state : tensor<2x8xf32>
  return
}

// -----

// A parameter update appended at the end of the entry (as dg-gradient-buffers appends the gradient
// buffers' sums) moves up, with its param op, to just after the gradient it adds: the gradient dies
// there instead of staying live through the tanh. Nothing else reads the buffer, so no value changes.
// CHECK-LABEL: func.func @updates_move_up
func.func @updates_move_up() attributes {dg.entry = "train_step"} {
  // CHECK: dg.input "x"
  // CHECK-NEXT: %[[G:.*]] = dg.exp
  // CHECK-NEXT: %[[B:.*]] = dg.param "grad/w"
  // CHECK-NEXT: %[[S:.*]] = dg.add %[[B]], %[[G]]
  // CHECK-NEXT: dg.assign %[[S]] to %[[B]]
  // CHECK-NEXT: dg.tanh
  %x = dg.input "x" : tensor<16xf32>
  %g = dg.exp %x : tensor<16xf32>
  %y = dg.tanh %x : tensor<16xf32>
  dg.output "y", %y : tensor<16xf32>
  %b = dg.param "grad/w" : tensor<16xf32>
  %s = dg.add %b, %g : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  dg.assign %s to %b : tensor<16xf32>
  return
}
