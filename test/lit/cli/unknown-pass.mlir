// An unknown pass is named in a clean error, whether it comes in a pipeline, nested in one, or as
// a flag; ae passes are module passes and cannot nest.
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-frobnicate)' 2>&1 | FileCheck %s --check-prefix=PIPE --implicit-check-not=Traceback
// RUN: not ae-opt %s --pass-pipeline='builtin.module(func.func(no-such-pass))' 2>&1 | FileCheck %s --check-prefix=NESTED --implicit-check-not=Traceback
// RUN: not ae-opt %s --attn-frobnicate 2>&1 | FileCheck %s --check-prefix=FLAG --implicit-check-not=Traceback
// RUN: not ae-opt %s --pass-pipeline='builtin.module(func.func(attn-verify))' 2>&1 | FileCheck %s --check-prefix=ANCHOR --implicit-check-not=Traceback
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-verify' 2>&1 | FileCheck %s --check-prefix=SYNTAX --implicit-check-not=Traceback
// RUN: not ae-opt %s --pass-pipeline='builtin.module(cse)' --attn-verify 2>&1 | FileCheck %s --check-prefix=BOTH --implicit-check-not=Traceback

// PIPE: error: unknown pass 'attn-frobnicate'
// NESTED: error: unknown pass 'no-such-pass'
// FLAG: error: unknown option or pass '--attn-frobnicate'
// ANCHOR: error: pass 'attn-verify' runs on builtin.module only; put it at the top level of the pipeline, not inside 'func.func(...)'
// SYNTAX: error: unbalanced brackets or quotes in pass pipeline 'builtin.module(attn-verify'
// BOTH: error: use only one of --pass-pipeline, --pipeline and individual pass options
