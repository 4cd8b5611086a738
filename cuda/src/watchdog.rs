//! Deadline-bounded driver calls.
//!
//! Driver calls cannot be interrupted. Each one runs on its own thread and the
//! caller stops waiting at the deadline; the thread is left to finish. When a
//! late call returns, an optional `late` hook sees its result, so that the
//! orchestrator can undo a lock nobody is waiting for any more. A per-job slot
//! decides, under a mutex, whether the result was delivered or abandoned, so
//! exactly one of "delivered" and "late hook" happens.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Work to run under the watchdog, keyed by pid.
pub(crate) struct Job<T> {
    pub(crate) pid: i32,
    pub(crate) work: Box<dyn FnOnce() -> T + Send>,
    /// Runs on the worker thread if the result arrives after the deadline.
    pub(crate) late: Option<Box<dyn FnOnce(T) + Send>>,
}

impl<T> Job<T> {
    pub(crate) fn new(pid: i32, work: impl FnOnce() -> T + Send + 'static) -> Self {
        Self {
            pid,
            work: Box::new(work),
            late: None,
        }
    }

    pub(crate) fn on_late(mut self, late: impl FnOnce(T) + Send + 'static) -> Self {
        self.late = Some(Box::new(late));
        self
    }
}

/// How a job ended from the caller's point of view.
#[derive(Debug)]
pub(crate) enum Finished<T> {
    Done {
        value: T,
        elapsed: Duration,
    },
    /// Still running in the driver when the deadline passed.
    TimedOut {
        waited: Duration,
    },
    /// The thread could not be started; the work never ran.
    NotStarted {
        reason: String,
    },
    /// The work panicked (a bug in an engine); it may have run part-way.
    Panicked {
        message: String,
    },
}

/// A started job's shared slot, or why it could not start.
type Started<T> = Result<Arc<Mutex<Slot<T>>>, String>;

enum Slot<T> {
    Pending,
    Delivered(T, Duration),
    Panicked(String),
    Abandoned,
    Taken,
}

/// Runs every job on its own thread and waits until all finish or `deadline`.
/// Results come back in job order.
pub(crate) fn run_all<T: Send + 'static>(
    label: &'static str,
    jobs: Vec<Job<T>>,
    deadline: Instant,
) -> Vec<(i32, Finished<T>)> {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel::<usize>();
    let mut slots: Vec<(i32, Started<T>)> = Vec::new();

    for (index, job) in jobs.into_iter().enumerate() {
        let slot = Arc::new(Mutex::new(Slot::Pending));
        let worker_slot = Arc::clone(&slot);
        let tx = tx.clone();
        let Job { pid, work, late } = job;
        let spawned = std::thread::Builder::new()
            .name(format!("gs-{label}-{pid}"))
            .spawn(move || {
                let begun = Instant::now();
                // A panic must not look like a hang: report it instead.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                let elapsed = begun.elapsed();
                let mut guard = worker_slot.lock().unwrap_or_else(PoisonError::into_inner);
                match (&*guard, result) {
                    (Slot::Abandoned, Ok(value)) => {
                        drop(guard);
                        tracing::warn!(
                            pid,
                            call = label,
                            elapsed_ms = elapsed.as_secs_f64() * 1e3,
                            "driver call returned after its deadline"
                        );
                        if let Some(late) = late {
                            late(value);
                        }
                    }
                    (Slot::Abandoned, Err(_)) => {}
                    (_, Ok(value)) => {
                        *guard = Slot::Delivered(value, elapsed);
                        drop(guard);
                        let _ = tx.send(index);
                    }
                    (_, Err(payload)) => {
                        *guard = Slot::Panicked(panic_message(payload.as_ref()));
                        drop(guard);
                        let _ = tx.send(index);
                    }
                }
            });
        slots.push((pid, spawned.map(|_| slot).map_err(|e| e.to_string())));
    }
    drop(tx);

    let mut outstanding = slots.iter().filter(|(_, slot)| slot.is_ok()).count();
    while outstanding > 0 {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match rx.recv_timeout(deadline - now) {
            Ok(_) => outstanding -= 1,
            Err(_) => break,
        }
    }

    let waited = started.elapsed();
    slots
        .into_iter()
        .map(|(pid, slot)| {
            let slot = match slot {
                Ok(slot) => slot,
                Err(reason) => return (pid, Finished::NotStarted { reason }),
            };
            let mut guard = slot.lock().unwrap_or_else(PoisonError::into_inner);
            let finished = match std::mem::replace(&mut *guard, Slot::Taken) {
                Slot::Delivered(value, elapsed) => Finished::Done { value, elapsed },
                Slot::Panicked(message) => Finished::Panicked { message },
                Slot::Pending => {
                    *guard = Slot::Abandoned;
                    tracing::error!(
                        pid,
                        call = label,
                        waited_ms = waited.as_secs_f64() * 1e3,
                        "driver call exceeded its deadline; no longer waiting for it"
                    );
                    Finished::TimedOut { waited }
                }
                Slot::Abandoned | Slot::Taken => Finished::TimedOut { waited },
            };
            (pid, finished)
        })
        .collect()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Runs one job under the watchdog.
pub(crate) fn run_one<T: Send + 'static>(
    label: &'static str,
    job: Job<T>,
    deadline: Instant,
) -> Finished<T> {
    run_all(label, vec![job], deadline)
        .pop()
        .map(|(_, f)| f)
        .unwrap_or(Finished::NotStarted {
            reason: "no result".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn results_come_back_in_job_order() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let jobs = vec![
            Job::new(1, || {
                std::thread::sleep(Duration::from_millis(30));
                10
            }),
            Job::new(2, || 20),
        ];
        let out = run_all("t", jobs, deadline);
        let values: Vec<(i32, i32)> = out
            .into_iter()
            .map(|(pid, f)| match f {
                Finished::Done { value, .. } => (pid, value),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(values, vec![(1, 10), (2, 20)]);
    }

    #[test]
    fn slow_job_times_out_and_late_hook_runs() {
        let late_ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&late_ran);
        let job = Job::new(7, || {
            std::thread::sleep(Duration::from_millis(300));
            42
        })
        .on_late(move |v| {
            assert_eq!(v, 42);
            flag.store(true, Ordering::SeqCst);
        });
        let finished = run_one("t", job, Instant::now() + Duration::from_millis(50));
        assert!(
            matches!(finished, Finished::TimedOut { .. }),
            "{finished:?}"
        );
        assert!(!late_ran.load(Ordering::SeqCst));
        let until = Instant::now() + Duration::from_secs(5);
        while !late_ran.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(late_ran.load(Ordering::SeqCst), "late hook never ran");
    }

    #[test]
    fn a_panicking_job_is_reported_not_waited_for() {
        let started = Instant::now();
        let job: Job<i32> = Job::new(9, || panic!("engine bug"));
        let out = run_one("t", job, Instant::now() + Duration::from_secs(30));
        assert!(
            matches!(&out, Finished::Panicked { message } if message == "engine bug"),
            "{out:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn past_deadline_still_collects_finished_work() {
        // A job that finished before we look is delivered even at a zero deadline.
        let job = Job::new(3, || 5);
        std::thread::sleep(Duration::from_millis(5));
        let out = run_one("t", job, Instant::now() + Duration::from_millis(200));
        assert!(matches!(out, Finished::Done { value: 5, .. }));
    }
}
