//! The Prometheus exporter for the metrics the library records ([`idem::metrics`]).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the global Prometheus recorder (once per process) and returns its handle.
pub fn install() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0,
            ];
            // Every histogram idem records, with buckets (without, the exporter writes
            // summaries, which dashboards cannot add up across instances).
            let mut builder = PrometheusBuilder::new();
            for histogram in idem::metrics::CATALOG
                .iter()
                .filter(|m| m.kind == idem::metrics::Kind::Histogram)
            {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(histogram.name.into()), &buckets)
                    .expect("static buckets are valid");
            }
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // build_recorder() starts no upkeep, and histogram samples pile up until
            // something drains them: with nobody scraping /metrics, the origin grew by
            // ~10 MB/s under load. Drain them every few seconds.
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("idem-metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_secs(2));
                    upkeep.run_upkeep();
                });
            // Another recorder may already be installed (an embedding application's);
            // then ours only renders what it was given, which is nothing.
            let _ = metrics::set_global_recorder(recorder);
            // Every metric the library records gets its help text from the start, and
            // every counter its series at 0.
            idem::metrics::describe();
            idem::metrics::register_counters();
            handle
        })
        .clone()
}
