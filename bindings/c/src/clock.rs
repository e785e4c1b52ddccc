//! Clocks: where a limiter's "now" comes from.

use std::time::Duration;

use throttlegate::{Clock, ManualClock};

use crate::{ffi, in_ref, out_ptr, tg_result, Fail};

/// A clock to pass to `tg_limiter_options_set_clock()`.
///
/// Without one, a limiter uses the backend's clock (Redis's `TIME`, or a
/// monotonic clock in the embedded backend). A manual clock only moves when
/// told to (tests, simulations); a system clock is this host's wall clock,
/// for Redis services that refuse `TIME` in scripts.
///
/// Thread safety: every function may be called on one clock from many
/// threads at once. Limiters made with a manual clock share it: moving the
/// clock moves them all, and the clock may be freed while they live on.
pub struct tg_clock {
    pub(crate) clock: Clock,
}

fn manual(clock: &tg_clock) -> Result<&ManualClock, Fail> {
    match &clock.clock {
        Clock::Manual(m) => Ok(m),
        _ => Err(Fail::invalid("clock: only a manual clock can be read or moved")),
    }
}

/// A manual clock reading `start_us` microseconds since the Unix epoch.
///
/// On success `*out` receives a new clock to release with `tg_clock_free()`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (`start_us` negative).
#[no_mangle]
pub unsafe extern "C" fn tg_clock_manual_new(start_us: i64, out: *mut *mut tg_clock) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        if start_us < 0 {
            return Err(Fail::invalid(format!("start_us: {start_us} must not be negative")));
        }
        *out = Box::into_raw(Box::new(tg_clock { clock: Clock::Manual(ManualClock::new(start_us)) }));
        Ok(())
    })
}

/// This host's wall clock.
///
/// On success `*out` receives a new clock to release with `tg_clock_free()`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_clock_system_new(out: *mut *mut tg_clock) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        *out = Box::into_raw(Box::new(tg_clock { clock: Clock::System }));
        Ok(())
    })
}

/// Move a manual clock forward by `ms` milliseconds.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (not a manual clock, or
/// `ms` so large that the reading would overflow).
#[no_mangle]
pub unsafe extern "C" fn tg_clock_advance_ms(clock: *const tg_clock, ms: u64) -> tg_result {
    ffi(|| {
        let clock = manual(in_ref(clock, "clock")?)?;
        let fits = ms
            .checked_mul(1000)
            .and_then(|us| i64::try_from(us).ok())
            .and_then(|us| clock.now_us().checked_add(us))
            .is_some();
        if !fits {
            return Err(Fail::invalid(format!("ms: {ms} would overflow the clock")));
        }
        clock.advance(Duration::from_millis(ms));
        Ok(())
    })
}

/// Set a manual clock's reading to `now_us` microseconds.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (not a manual clock, or
/// `now_us` negative).
#[no_mangle]
pub unsafe extern "C" fn tg_clock_set_us(clock: *const tg_clock, now_us: i64) -> tg_result {
    ffi(|| {
        let clock = manual(in_ref(clock, "clock")?)?;
        if now_us < 0 {
            return Err(Fail::invalid(format!("now_us: {now_us} must not be negative")));
        }
        clock.set_us(now_us);
        Ok(())
    })
}

/// A manual clock's reading in microseconds, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (not a manual clock).
#[no_mangle]
pub unsafe extern "C" fn tg_clock_now_us(clock: *const tg_clock, out: *mut i64) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let clock = manual(in_ref(clock, "clock")?)?;
        *out = clock.now_us();
        Ok(())
    })
}

/// Release a clock. `NULL` is a no-op. Limiters using it keep their share.
#[no_mangle]
pub unsafe extern "C" fn tg_clock_free(clock: *mut tg_clock) {
    crate::ffi_value((), || {
        if !clock.is_null() {
            drop(Box::from_raw(clock));
        }
    });
}
