// RUN: dgemma-opt %s --split-input-file --dg-test-sharding-rules --verify-diagnostics
// dg.canvas_sample: its sharding rule (every dimension whole) and its verifier.

func.func @rule(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k], [i], [i, l]) -> ([i, j], [i, j], [i, j], [i, j, k]) {i=2, j=3, k=5, l=2} need_replication={i, j, k, l}>}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x5xbf16>
  return
}

// -----

func.func @logits_rank(%logits: tensor<6x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{logits must be [batch, canvas, vocab], got 'tensor<6x5xf32>'}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<6x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<6x5xf32>
  return
}

// -----

func.func @logits_f32(%logits: tensor<2x3x5xbf16>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of 32-bit float values}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xbf16>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x5xbf16>
  return
}

// -----

func.func @empty_vocab(%logits: tensor<2x3x0xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{the vocabulary must not be empty}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x0xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x0xf32>
  return
}

// -----

func.func @temperature_per_row(%logits: tensor<2x3x5xf32>, %t: tensor<f32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{temperature must be [2] (one per row), got 'tensor<f32>'}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<f32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x5xf32>
  return
}

// -----

func.func @key_per_row(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2xi64>) {
  // expected-error @+1 {{key must be [2, 2] (seed, offset per row), got 'tensor<2xi64>'}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x5xf32>
  return
}

// -----

func.func @ids_per_position(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{sampled and argmax must be 'tensor<2x3xi64>'}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<3x2xi64>, tensor<2x3xf32>, tensor<2x3x5xf32>
  return
}

// -----

func.func @entropy_per_position(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{entropy must be 'tensor<2x3xf32>', got 'tensor<2x3x1xf32>'}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3x1xf32>, tensor<2x3x5xf32>
  return
}

// -----

func.func @scaled_shape(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{scaled must have the logits' shape [2, 3, 5], got 'tensor<2x3x4xbf16>'}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x4xbf16>
  return
}

// -----

func.func @scaled_dtype(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{result #3 must be ranked tensor of 32-bit float or bfloat16 type values}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x5xf16>
  return
}

// -----

func.func @softcap_non_negative(%logits: tensor<2x3x5xf32>, %t: tensor<2xf32>, %key: tensor<2x2xi64>) {
  // expected-error @+1 {{softcap must be >= 0 (0: none)}}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key {softcap = -1.0 : f64} : tensor<2x3x5xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x5xf32>
  return
}
