//! Data-parallel batches: a large batch's rows are split into shards, each shard runs on its own
//! thread with its own replica of the head (`Module::fork`: the same parameter ids, its own
//! autodiff graph), and the shards' gradients are summed before the one optimiser step. Each
//! shard's loss is weighted by its share of the batch, so the sum is the gradient of the whole
//! batch's loss when every term of that loss is a mean over the batch's rows or does not depend
//! on them (cross-entropy, FedProx's proximal term).
//!
//! A shard's forward and backward pass includes Burn's bookkeeping, allocation and the small
//! element-wise kernels, which the matrix kernels' own threading leaves on one core: splitting
//! the batch puts all of it on both (BENCHMARKS.md, "Head training on both cores"). The worker
//! threads live for the whole local round: a thread started per step ran 1280→256→65 at batch
//! 64 no faster than one thread, because every new thread faulted its buffers in afresh.

use std::sync::mpsc::{self, Receiver, Sender};

use burn::module::{Module, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use fedge_models::Head;

/// Multiply–adds of the projector's forward pass (rows × inputs × hidden) a shard needs at
/// least: below, handing the shard over and summing the gradients cost what the second thread
/// saves. Measured with `fedge bench head --threads 1,2`: 512→128→10 at batch 64 (4 Mi) 0.98×
/// one thread, at batch 128 1.18×; 1280→256→65 at batch 64 1.41× (BENCHMARKS.md).
pub const MIN_SHARD_WORK: usize = 4 * 1024 * 1024;

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

/// A shard's work: the replica, its rows and their share of the batch.
type Job = (Head, Vec<usize>, f32);
/// A shard's gradients and its weighted loss (detached).
type Done = (GradientsParams, Tensor<1>);

/// Threads that live for one local round and each compute one shard of every split batch; the
/// calling thread computes the first. Kept for the round so that a thread's allocations are
/// reused from step to step.
pub(crate) struct Workers {
    lanes: Vec<(Sender<Job>, Receiver<Done>)>,
}

impl Workers {
    /// Threads besides the calling one.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// The gradients of the batch `rows` and its loss (detached), in `shards` shards (at most
    /// one more than [`Workers::len`]): `loss_of(head, shard_rows)` is the loss of a shard as
    /// the whole batch's would be computed.
    pub(crate) fn gradients<F>(
        &self,
        head: &Head,
        rows: &[usize],
        shards: usize,
        device: &Device,
        loss_of: &F,
    ) -> (GradientsParams, Tensor<1>)
    where
        F: Fn(&Head, &[usize]) -> Tensor<1>,
    {
        let total = rows.len() as f32;
        let size = rows.len().div_ceil(shards.clamp(1, self.lanes.len() + 1));
        let mut parts = rows.chunks(size);
        let first = parts.next().unwrap_or(&[]);
        let mut sent = Vec::new();
        for ((jobs, done), part) in self.lanes.iter().zip(parts) {
            let replica = head.clone().fork(device);
            let job = (replica, part.to_vec(), part.len() as f32 / total);
            if jobs.send(job).is_ok() {
                sent.push(done);
            }
        }
        let (mut grads, mut value) = weighted(loss_of, head, first, first.len() as f32 / total);
        for done in sent {
            let (more, v) = done.recv().expect("a training worker stopped");
            add_into(&mut grads, more, head);
            value = value + v;
        }
        (grads, value)
    }
}

/// Runs `body` with `extra` worker threads computing shards with `loss_of`.
pub(crate) fn with_workers<F, R>(extra: usize, loss_of: &F, body: impl FnOnce(&Workers) -> R) -> R
where
    F: Fn(&Head, &[usize]) -> Tensor<1> + Sync,
{
    std::thread::scope(|scope| {
        let lanes = (0..extra)
            .map(|_| {
                let (jobs, job_rx) = mpsc::channel::<Job>();
                let (done_tx, done) = mpsc::channel::<Done>();
                scope.spawn(move || {
                    for (replica, rows, share) in job_rx {
                        let result = weighted(loss_of, &replica, &rows, share);
                        if done_tx.send(result).is_err() {
                            break;
                        }
                    }
                });
                (jobs, done)
            })
            .collect();
        let workers = Workers { lanes };
        let out = body(&workers);
        // Closing the lanes ends the threads; the scope joins them.
        drop(workers);
        out
    })
}

/// One shard's gradients, its loss weighted by `share` of the batch.
fn weighted<F>(loss_of: &F, head: &Head, rows: &[usize], share: f32) -> Done
where
    F: Fn(&Head, &[usize]) -> Tensor<1>,
{
    let loss = loss_of(head, rows).mul_scalar(share);
    let value = loss.clone().detach();
    (GradientsParams::from_grads(loss.backward(), head), value)
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
