// RUN: dgemma-opt %s --dg-cost-report --verify-diagnostics
// Communication bytes: what one rank receives, with ring algorithms. The f32 input is 8x16 = 512 bytes.

module attributes {dg.mesh = #dg.mesh<[one = 1 (data), tp = 4 (tensor)]>} {
  // all_reduce 2*(4-1)/4*512 = 768, all_gather 3*512 = 1536, reduce_scatter 3*128 = 384,
  // broadcast 512, reduce_to_root 3*512 = 1536, all_to_all capacity 10*4*2 = 80 plus 3 counts of 8.
  // Total 768 + 1536 + 384 + 512 + 1536 + 104 = 4840.
  // expected-remark @+1 {{cost: flops=0 parameters=0 parameter_bytes=0 communication_bytes=4840}}
  func.func @tp() attributes {dg.entry = "tp"} {
    %x = dg.input "x" : tensor<8x16xf32>
    %rows = dg.input "rows" : tensor<6x4xbf16>
    %counts = dg.input "counts" : tensor<4xi64>
    %ar = dg.all_reduce %x axis = "tp" : tensor<8x16xf32> -> tensor<8x16xf32>
    %ag = dg.all_gather %x axis = "tp" : tensor<8x16xf32> -> tensor<32x16xf32>
    %rs = dg.reduce_scatter %x axis = "tp" : tensor<8x16xf32> -> tensor<2x16xf32>
    %bc = dg.broadcast %x axis = "tp" root = 1 : tensor<8x16xf32> -> tensor<8x16xf32>
    %rr = dg.reduce_to_root %x axis = "tp" root = 1 : tensor<8x16xf32> -> tensor<8x16xf32>
    %y, %n = dg.all_to_all %rows, %counts axis = "tp" : tensor<6x4xbf16>, tensor<4xi64> -> tensor<10x4xbf16>, tensor<4xi64>
    return
  }

  // A group of one moves nothing, so no communication is reported.
  // expected-remark @+1 {{cost: flops=0 parameters=0 parameter_bytes=0}}
  func.func @single() attributes {dg.entry = "single"} {
    %x = dg.input "x" : tensor<8x16xf32>
    %counts = dg.input "counts" : tensor<1xi64>
    %ar = dg.all_reduce %x axis = "one" : tensor<8x16xf32> -> tensor<8x16xf32>
    %ag = dg.all_gather %x axis = "one" : tensor<8x16xf32> -> tensor<8x16xf32>
    %bc = dg.broadcast %x axis = "one" root = 0 : tensor<8x16xf32> -> tensor<8x16xf32>
    %y, %n = dg.all_to_all %x, %counts axis = "one" : tensor<8x16xf32>, tensor<1xi64> -> tensor<8x16xf32>, tensor<1xi64>
    return
  }
}
