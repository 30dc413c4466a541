// RUN: dgemma-opt %s --dg-memory-plan --dg-cost-report --verify-diagnostics

// matmul 2*2*4*8*16 = 2048, rms_norm 4*64 = 256, softmax 5*128 = 640; two parameters, 8*4 + 8*16*4 bytes.
// expected-remark @+1 {{cost: flops=2944 parameters=2 parameter_bytes=544 scratch_bytes=1024}}
func.func @forward() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<2x4x8xf32>
  %w = dg.param "norm.weight" : tensor<8xf32>
  %p = dg.param "proj.weight" : tensor<8x16xf32>
  %n = dg.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %m = dg.matmul %n, %p : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  %s = dg.softmax %m axis = -1 : tensor<2x4x16xf32>
  dg.output "probs", %s : tensor<2x4x16xf32>
  return
}

// Functions that are not entry points are not reported.
func.func @helper() {
  return
}
