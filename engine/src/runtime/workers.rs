//! Where tasks run: a pool of worker threads, each driving a single-threaded tokio runtime of
//! its own, and the placement of every task on one of them, where it stays.
//!
//! Tasks are long and CPU-bound (a chain runs whole batches through its operators), which is
//! not what a work-stealing scheduler expects. On tokio's multi-thread runtime a woken task is
//! queued on the worker that woke it, in a slot other workers cannot steal from, and a task
//! that yields waits on that worker until it runs out of other work: the two subtasks of a
//! keyed operator, both fed by the same source, ended up taking turns on one thread while the
//! other sat idle (W4 at parallelism 2 used 1.1 cores of 2). Here every task is placed, when
//! it is spawned, on the worker that runs the fewest tasks of the job (ties go round the
//! workers), so the subtasks of one chain land on different threads; a wake-up from another
//! thread goes to the task's own worker. The price is that a worker cannot take over another's
//! tasks; chain tasks yield between slow batches so that the tasks sharing their worker keep
//! moving.
//!
//! This module only places and runs futures; what a task does is [`super::task`]'s business.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};

use crate::base::error::{Result, RunError};

/// Where a job's tasks are spawned: its own pool of worker threads, or a tokio runtime the
/// caller provides (tests that drive a job on runtimes of their own).
#[derive(Clone, Debug)]
pub enum Workers {
    /// A runtime given by the caller; tokio decides where each task runs.
    Runtime(Handle),
    /// The job's worker threads; each task stays on the one it was placed on.
    Pool(Arc<WorkerPool>),
}

impl From<Handle> for Workers {
    fn from(handle: Handle) -> Self {
        Self::Runtime(handle)
    }
}

impl Workers {
    /// Spawns `task` into `join` on the worker the placement chooses.
    pub fn spawn<T, F>(&self, join: &mut JoinSet<T>, task: F) -> AbortHandle
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        match self {
            Self::Runtime(handle) => join.spawn_on(task, handle),
            Self::Pool(pool) => {
                let (handle, placed) = pool.place();
                join.spawn_on(
                    async move {
                        let _placed = placed;
                        task.await
                    },
                    handle,
                )
            }
        }
    }
}

/// One worker thread of a [`WorkerPool`].
#[derive(Debug)]
struct Worker {
    handle: Handle,
    /// Tasks placed here and not ended yet.
    tasks: Arc<AtomicUsize>,
}

/// A task's place on a worker: counted there until the task ends (or is dropped).
struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Worker threads, each running a single-threaded tokio runtime (timers and I/O enabled);
/// [`WorkerPool::shutdown`] stops them.
#[derive(Debug)]
pub struct WorkerPool {
    workers: Vec<Worker>,
    /// Where the round of ties starts for the next placement.
    next: AtomicUsize,
    /// Tells each thread to stop (taken by the first shutdown).
    stop: Mutex<Vec<oneshot::Sender<()>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl WorkerPool {
    /// Starts `n` worker threads (at least one) named `weir-worker` with `stack_size`-byte
    /// stacks; their blocking pools' threads are named `weir-blocking`.
    ///
    /// # Errors
    /// [`RunError::Internal`] when a thread or its runtime cannot start (the threads already
    /// started are stopped).
    pub fn start(n: usize, stack_size: usize) -> Result<Arc<Self>> {
        let mut pool = Self {
            workers: Vec::new(),
            next: AtomicUsize::new(0),
            stop: Mutex::default(),
            threads: Mutex::default(),
        };
        for i in 0..n.max(1) {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name("weir-worker".into())
                .stack_size(stack_size)
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .thread_name("weir-blocking")
                        .build();
                    match rt {
                        Ok(rt) => {
                            let _ = ready_tx.send(Ok(rt.handle().clone()));
                            // Spawned tasks run while this waits; the runtime drops whatever
                            // is left when it is told to stop.
                            let _ = rt.block_on(stop_rx);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                        }
                    }
                });
            let started = match thread {
                Ok(thread) => {
                    pool.threads_mut().push(thread);
                    pool.stop_mut().push(stop_tx);
                    ready_rx
                        .recv()
                        .map_err(|_| "the thread ended before its runtime started".to_owned())
                        .and_then(|r| r)
                }
                Err(e) => Err(e.to_string()),
            };
            match started {
                Ok(handle) => pool.workers.push(Worker {
                    handle,
                    tasks: Arc::default(),
                }),
                Err(e) => {
                    pool.shutdown();
                    return Err(RunError::Internal(format!(
                        "cannot start worker thread {i}: {e}"
                    )));
                }
            }
        }
        Ok(Arc::new(pool))
    }

    fn threads_mut(&self) -> std::sync::MutexGuard<'_, Vec<std::thread::JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stop_mut(&self) -> std::sync::MutexGuard<'_, Vec<oneshot::Sender<()>>> {
        self.stop.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of worker threads.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether the pool has no worker (never: it starts at least one).
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Tasks placed on each worker and still running.
    pub fn load(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.tasks.load(Ordering::Relaxed))
            .collect()
    }

    /// Chooses the worker for a new task: the one running the fewest tasks, ties going round
    /// the workers from one placement to the next.
    fn place(&self) -> (&Handle, Placed) {
        let n = self.workers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let chosen = (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| self.workers[i].tasks.load(Ordering::Relaxed))
            .unwrap_or(0);
        let worker = &self.workers[chosen];
        worker.tasks.fetch_add(1, Ordering::Relaxed);
        (&worker.handle, Placed(Arc::clone(&worker.tasks)))
    }

    /// Stops every worker thread and waits for them: each runtime drops the tasks it still
    /// has and waits for its blocking work (a snapshot being written). Call it from outside
    /// the pool (a worker would wait for itself); a second call does nothing.
    pub fn shutdown(&self) {
        for stop in self.stop_mut().drain(..) {
            let _ = stop.send(());
        }
        let threads: Vec<_> = self.threads_mut().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for WorkerPool {
    /// Tells the threads to stop without waiting for them (the last reference may be dropped
    /// on a worker itself).
    fn drop(&mut self) {
        for stop in self.stop_mut().drain(..) {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `n` workers, its [`Workers`], and a runtime for the test to drive it from.
    fn pool_of(n: usize) -> (Arc<WorkerPool>, Workers, tokio::runtime::Runtime) {
        let pool = WorkerPool::start(n, 1 << 20).expect("pool");
        let workers = Workers::Pool(Arc::clone(&pool));
        let control = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        (pool, workers, control)
    }

    #[test]
    fn tasks_spread_over_the_workers_and_free_their_place_when_they_end() {
        let (pool, workers, control) = pool_of(2);
        control.block_on(async {
            let mut join = JoinSet::new();
            let (release, gate) = tokio::sync::watch::channel(false);
            let mut threads = Vec::new();
            for _ in 0..4 {
                let mut gate = gate.clone();
                let (tx, rx) = oneshot::channel();
                workers.spawn(&mut join, async move {
                    let _ = tx.send(std::thread::current().id());
                    let _ = gate.wait_for(|open| *open).await;
                });
                threads.push(rx.await.expect("the task ran"));
            }
            assert_eq!(pool.load(), vec![2, 2]);
            // Subtasks spawned one after the other alternate between the two threads.
            assert_ne!(threads[0], threads[1]);
            assert_eq!(threads[0], threads[2]);
            assert_eq!(threads[1], threads[3]);
            release.send(true).expect("tasks wait");
            while join.join_next().await.is_some() {}
            assert_eq!(pool.load(), vec![0, 0]);
            // A new task goes where there is room: both are empty, so either.
            let (tx, rx) = oneshot::channel();
            workers.spawn(&mut join, async move {
                let _ = tx.send(());
            });
            rx.await.expect("ran");
        });
        pool.shutdown();
        pool.shutdown();
    }

    #[test]
    fn the_least_loaded_worker_gets_the_next_task() {
        let (pool, workers, control) = pool_of(3);
        control.block_on(async {
            let mut join = JoinSet::new();
            let (release, gate) = tokio::sync::watch::channel(0u32);
            for i in 0..3u32 {
                let mut gate = gate.clone();
                workers.spawn(&mut join, async move {
                    let _ = gate.wait_for(|&n| n > i).await;
                });
            }
            assert_eq!(pool.load(), vec![1, 1, 1]);
            // The first task (worker 0) ends: the next one takes its place.
            release.send(1).expect("tasks wait");
            join.join_next().await.expect("one ended").expect("no panic");
            assert_eq!(pool.load(), vec![0, 1, 1]);
            let mut gate = gate.clone();
            workers.spawn(&mut join, async move {
                let _ = gate.wait_for(|&n| n > 3).await;
            });
            assert_eq!(pool.load(), vec![1, 1, 1]);
            release.send(9).expect("tasks wait");
            while join.join_next().await.is_some() {}
        });
        pool.shutdown();
    }
}
