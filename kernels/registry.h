// The kernels tfe can specialize: the registry's functions (kernels/kernel_def.h) and every kernel's
// description (kernels/<kernel>.h), among them gemv's shape helpers that the planner uses.
#pragma once
#include "kernels/kernel_def.h"

#include "kernels/copy_rows.h"
#include "kernels/gather_taps.h"
#include "kernels/gemv.h"
#include "kernels/keep_state.h"
#include "kernels/load_tables.h"
#include "kernels/prepare_x.h"
#include "kernels/qk_rope_kv.h"
#include "kernels/ranked.h"
#include "kernels/rescore.h"
#include "kernels/ring_attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/store_outputs.h"
#include "kernels/top1.h"
#include "kernels/topk.h"
