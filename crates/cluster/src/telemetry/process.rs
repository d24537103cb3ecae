//! The standard `process_*` metrics (resident memory, CPU time, open file
//! descriptors, threads, start time), read from `/proc/self` on each
//! scrape through the `procfs` crate. prometheus-client has no process
//! collector of its own, so this small one is ours; elsewhere than Linux it
//! exposes nothing.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub struct ProcessCollector;

/// What one scrape reads.
struct Sample {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_time_seconds: f64,
    threads: f64,
    open_fds: f64,
    max_fds: Option<f64>,
}

fn sample() -> Option<Sample> {
    let me = procfs::process::Process::myself().ok()?;
    let stat = me.stat().ok()?;
    let ticks = procfs::ticks_per_second() as f64;
    let page = procfs::page_size() as f64;
    let boot = procfs::boot_time_secs().ok()? as f64;
    let max_fds = me
        .limits()
        .ok()
        .and_then(|l| match l.max_open_files.soft_limit {
            procfs::process::LimitValue::Value(v) => Some(v as f64),
            procfs::process::LimitValue::Unlimited => None,
        });
    Some(Sample {
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        resident_bytes: stat.rss as f64 * page,
        virtual_bytes: stat.vsize as f64,
        start_time_seconds: boot + stat.starttime as f64 / ticks,
        threads: stat.num_threads as f64,
        open_fds: me.fd_count().ok()? as f64,
        max_fds,
    })
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(s) = sample() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            s.resident_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            s.virtual_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            s.start_time_seconds,
        )?;
        gauge(
            &mut encoder,
            "process_threads",
            "Number of OS threads in the process",
            s.threads,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            s.open_fds,
        )?;
        if let Some(max) = s.max_fds {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(200) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let s = super::sample().expect("/proc/self is readable");
        assert!(
            s.cpu_seconds >= 0.1,
            "burned 0.2 s of CPU: {}",
            s.cpu_seconds
        );
        assert!(s.resident_bytes > 1e6 && s.threads >= 1.0 && s.open_fds >= 3.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - 3600.0..=now).contains(&s.start_time_seconds));
    }
}
