//! What an engine step or a verb leaves for after it: the consumer's callbacks (completion and
//! asynchronous event handlers) and, from an engine step, the wake-ups it owes (a completion
//! channel's event, an asynchronous event with its descriptor and waiters).
//!
//! The transport writes CQEs during a step (a full CQ moves the QP to Error then, CQ-OVF-2),
//! but never makes a system call, signals a condition variable or runs consumer code inside
//! one: those are queued here and done once the step has returned and released its locks, by
//! the thread that drove it. Inside a verb, callbacks are queued the same way, so a handler
//! may call any verb, on the same QP or CQ included; a verb's own events are delivered at once
//! (Destroy purges the events of what it destroys, and must see them).

use std::cell::{Cell, RefCell};

type Call = Box<dyn FnOnce()>;

thread_local! {
    static PENDING: RefCell<Option<Vec<Call>>> = const { RefCell::new(None) };
    /// Engine steps open on this thread.
    static IN_STEP: Cell<u32> = const { Cell::new(0) };
}

/// Closes the outermost scope even if a callback panics, so later verbs do not queue forever.
struct Outermost;

impl Drop for Outermost {
    fn drop(&mut self) {
        let _ = PENDING.try_with(|p| *p.borrow_mut() = None);
    }
}

/// Runs `f`; what it queues meanwhile runs after it, on this thread, once no lock is held.
/// Nested scopes hand theirs to the outermost. On a thread whose thread-locals are being torn
/// down (a verb, or the drop of a last handle, from another thread-local's destructor) there
/// is no queue: `f` runs, and what it would queue runs at once (see [`call`]).
pub(crate) fn scope<R>(f: impl FnOnce() -> R) -> R {
    let outermost = PENDING.try_with(|p| {
        let mut p = p.borrow_mut();
        p.is_none().then(|| *p = Some(Vec::new())).is_some()
    });
    if outermost != Ok(true) {
        return f();
    }
    let _guard = Outermost;
    let r = f();
    loop {
        // A callback that calls verbs may queue more; they join this same loop.
        let calls =
            PENDING.try_with(|p| p.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default()).unwrap_or_default();
        if calls.is_empty() {
            break;
        }
        for c in calls {
            c();
        }
    }
    r
}

/// Leaves the step count as it was even if the step panics.
struct StepGuard;

impl Drop for StepGuard {
    fn drop(&mut self) {
        let _ = IN_STEP.try_with(|s| s.set(s.get() - 1));
    }
}

/// Runs an engine step `f` as a [`scope`] in which wake-ups are deferred too (see [`wake`]).
pub(crate) fn step<R>(f: impl FnOnce() -> R) -> R {
    scope(|| {
        let _ = IN_STEP.try_with(|s| s.set(s.get() + 1));
        let _guard = StepGuard;
        f()
    })
}

/// Runs `call` now when no scope is open on this thread (or its thread-locals are gone), else
/// when the outermost one ends.
pub(crate) fn call(call: impl FnOnce() + 'static) {
    let mut call = Some(call);
    let _ = PENDING.try_with(|p| {
        if let Some(queue) = p.borrow_mut().as_mut() {
            if let Some(c) = call.take() {
                queue.push(Box::new(c));
            }
        }
    });
    if let Some(c) = call {
        c();
    }
}

/// Runs a wake-up `w` (an eventfd write, a condition variable signal) now, or, inside an engine
/// step, once the step is over, in the order the step raised them.
pub(crate) fn wake(w: impl FnOnce() + 'static) {
    if IN_STEP.try_with(|s| s.get()).unwrap_or(0) > 0 {
        call(w);
    } else {
        w();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// Inside an engine step a wake-up waits for the step's end, in order, and a callback
    /// after it; outside one it runs at once.
    #[test]
    fn wakes_wait_for_the_end_of_a_step() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        wake(move || l.borrow_mut().push("outside"));
        assert_eq!(*log.borrow(), ["outside"]);
        let l = log.clone();
        step(|| {
            let (a, b, c) = (l.clone(), l.clone(), l.clone());
            wake(move || a.borrow_mut().push("wake 1"));
            call(move || b.borrow_mut().push("callback"));
            wake(move || c.borrow_mut().push("wake 2"));
            l.borrow_mut().push("step");
        });
        assert_eq!(*log.borrow(), ["outside", "step", "wake 1", "callback", "wake 2"]);
        let l = log.clone();
        scope(|| wake(move || l.borrow_mut().push("verb")));
        assert_eq!(log.borrow().last(), Some(&"verb"));
    }
}
