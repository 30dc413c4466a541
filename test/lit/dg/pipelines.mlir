// RUN: dgemma-opt %s --dg-train-pipeline | FileCheck %s --check-prefix=TRAIN
// RUN: dgemma-opt %s --dg-train-pipeline="optimizer=false loss=loss" | FileCheck %s --check-prefix=NOOPT
// RUN: dgemma-opt %s --dg-infer-pipeline | FileCheck %s --check-prefix=INFER
// RUN: dgemma-opt %s --dg-train-pipeline --dg-plan-pipeline | FileCheck %s --check-prefix=PLAN

// The stages dgemma-compile runs, as dgemma-opt pipelines.
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<3x4xf32>
  %x = dg.input "x" : tensor<3x4xf32>
  %y = dg.mul %w, %x : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}

// Mode train: the gradient accumulates in its device buffer, and the optimizer entry reads it.
// TRAIN-LABEL: func.func @train_step()
// TRAIN: dg.param "grad/w" {init = {kind = "zeros"}, trainable = false}
// TRAIN: dg.assign
// TRAIN-LABEL: func.func @optimizer_step()
// TRAIN: dg.param "grad/w"
// TRAIN: dg.adamw

// NOOPT-LABEL: func.func @train_step()
// NOOPT: dg.output "grad/w"
// NOOPT-NOT: optimizer_step

// Mode infer: simplification only, no gradients.
// INFER-LABEL: func.func @train_step()
// INFER-NOT: grad/
// INFER-NOT: optimizer_step

// Planning places every scratch value.
// PLAN-LABEL: func.func @train_step()
// PLAN-SAME: dg.scratch_bytes
// PLAN: dg.mul {{.*}}dg.offsets
