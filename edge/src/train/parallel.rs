//! Data-parallel batches: a large batch's rows are split into shards, each shard runs on its own
//! thread with its own replica of the head (`Module::fork`: the same parameter ids, its own
//! autodiff graph), and the shards' gradients are summed before the one optimiser step. Each
//! shard's loss is weighted by its share of the batch, so the sum is the gradient of the whole
//! batch's loss when every term of that loss is a mean over the batch's rows or does not depend
//! on them (cross-entropy, FedProx's proximal term).
//!
//! A shard's forward and backward pass includes Burn's bookkeeping, allocation and the small
//! element-wise kernels, which the matrix kernels' own threading leaves on one core: splitting
//! the batch puts all of it on both (BENCHMARKS.md, "Head training on both cores").

use burn::module::{Module, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use fedge_models::Head;

/// Multiply–adds of the projector's forward pass (rows × inputs × hidden) below which one
/// thread is faster than two: a thread's start and the gradients' sum cost more than half the
/// step saves. Measured with `fedge bench head --threads 1,2` (BENCHMARKS.md).
pub const MIN_SHARD_WORK: usize = 2 * 1024 * 1024;

/// Rows a shard needs at least.
const MIN_SHARD_ROWS: usize = 8;

/// How many shards a batch of `rows` rows through an `inputs → hidden` projector runs in, with
/// `threads` threads allowed: as many as keep each shard above [`MIN_SHARD_WORK`].
pub fn shards(rows: usize, inputs: usize, hidden: usize, threads: usize) -> usize {
    let work = rows.saturating_mul(inputs).saturating_mul(hidden);
    (work / MIN_SHARD_WORK)
        .min(rows / MIN_SHARD_ROWS)
        .min(threads)
        .max(1)
}

/// The gradients of the batch `rows` and its loss (detached), computed in `shards` shards:
/// `loss_of(head, shard_rows)` is the loss of a shard as the whole batch's would be computed.
pub(crate) fn gradients<F>(
    head: &Head,
    rows: &[usize],
    shards: usize,
    device: &Device,
    loss_of: F,
) -> (GradientsParams, Tensor<1>)
where
    F: Fn(&Head, &[usize]) -> Tensor<1> + Sync,
{
    let total = rows.len() as f32;
    let parts: Vec<&[usize]> = rows.chunks(rows.len().div_ceil(shards.max(1))).collect();
    let weighted = |h: &Head, part: &[usize]| {
        let loss = loss_of(h, part).mul_scalar(part.len() as f32 / total);
        let value = loss.clone().detach();
        (GradientsParams::from_grads(loss.backward(), h), value)
    };
    std::thread::scope(|scope| {
        let others: Vec<_> = parts[1..]
            .iter()
            .map(|part| {
                let replica = head.clone().fork(device);
                let weighted = &weighted;
                scope.spawn(move || weighted(&replica, part))
            })
            .collect();
        let (mut grads, mut value) = weighted(head, parts[0]);
        for other in others {
            let (more, v) = other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            add_into(&mut grads, more, head);
            value = value + v;
        }
        (grads, value)
    })
}

/// Adds `more`'s gradient of each of the head's parameters to `grads`'.
fn add_into(grads: &mut GradientsParams, mut more: GradientsParams, head: &Head) {
    for linear in [&head.projector, &head.classifier] {
        add::<2>(grads, &mut more, linear.weight.id);
        if let Some(bias) = &linear.bias {
            add::<1>(grads, &mut more, bias.id);
        }
    }
}

fn add<const D: usize>(grads: &mut GradientsParams, more: &mut GradientsParams, id: ParamId) {
    match (grads.remove::<D>(id), more.remove::<D>(id)) {
        (Some(a), Some(b)) => grads.register(id, a + b),
        (Some(a), None) | (None, Some(a)) => grads.register(id, a),
        (None, None) => {}
    }
}
