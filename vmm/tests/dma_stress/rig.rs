//! The test rig: one vIOMMU with a request queue per guest thread, and
//! behind it, per guest thread, one endpoint of each consumer kind, wired
//! the way dmavisor wires its devices; then the run and its report.

use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_iommu::device::{IommuConfig, IommuDevice};
use virtio_iommu::quiesce::Quiescer;
use virtio_iommu::wire::feature;
use vmm::dma::iommu::IommuTranslate;
use vmm::dma::{DmaSpace, ThreadDma};
use vmm::memory::create_guest_memory;
use vmm::vfio::VfioMirror;
use vmm::vhost_user::client::Client;
use vmm::vhost_user::iotlb::{serve_backend_channel, BackendIotlb};
use vmm::vhost_user::stop::BackendStop;

use super::guest::Guest;
use super::rng::Rng;
use super::vfio::RecordingHost;
use super::vhost::BackendCache;
use super::{emulated, lowest_priority, vfio, vhost, Kind, KindStats, Shared, KINDS, RAM};
use std::sync::atomic::AtomicU64;

/// Guest threads, one request queue each.
pub const GUESTS: usize = 2;
/// Emulated device threads (each serves every guest's endpoint).
pub const DEVICE_THREADS: usize = 2;

/// dmavisor's side of one vhost-user back-end, and the back-end's.
struct VhostPair {
    guest: usize,
    iotlb: Arc<BackendIotlb>,
    cache: Arc<BackendCache>,
    /// The back-end's end of the front-end channel.
    frontend: UnixStream,
    /// The back-end's end of the back-end channel, and dmavisor's.
    backend_end: UnixStream,
    vmm_end: UnixStream,
}

impl VhostPair {
    fn new(dev: &IommuDevice, shared: &Shared, guest: usize) -> Self {
        let endpoint = Kind::VhostUser.endpoint(guest);
        let (ours, theirs) = UnixStream::pair().expect("front-end socket pair");
        let mut client = Client::from_stream(ours).expect("client");
        client.enable_reply_ack();
        // A stop that cannot be confirmed ends the VMM; here it fails the
        // run.
        let stop = Arc::new(BackendStop::new(Box::new(|why: &str| {
            panic!("vhost-user back-end stop not confirmed: {why}")
        })));
        let iotlb = Arc::new(BackendIotlb::new(
            Arc::new(Mutex::new(client)),
            stop,
            shared.mem.clone(),
        ));
        iotlb.set_endpoint(dev.endpoint_dma(endpoint).expect("endpoint"));
        dev.add_invalidator(iotlb.clone());
        dev.add_endpoint_listener(iotlb.clone());
        let (vmm_end, backend_end) = UnixStream::pair().expect("back-end socket pair");
        Self {
            guest,
            iotlb,
            cache: Arc::new(BackendCache::default()),
            frontend: theirs,
            backend_end,
            vmm_end,
        }
    }
}

/// Everything one run uses.
pub struct Rig {
    /// What every thread shares (RAM, tickets, counters).
    pub shared: Shared,
    dev: IommuDevice,
    quiescer: Arc<Quiescer>,
    spaces: Vec<DmaSpace>,
    hosts: Vec<Arc<RecordingHost>>,
    mirrors: Vec<Arc<VfioMirror>>,
    vhosts: Vec<VhostPair>,
}

fn clone(s: &UnixStream) -> UnixStream {
    s.try_clone().expect("socket clone")
}

impl Rig {
    /// The vIOMMU and its consumers, every endpoint unattached.
    pub fn new() -> Self {
        let mem = create_guest_memory(RAM, false, false).expect("guest RAM");
        let shared = Shared::new(mem, GUESTS);
        let dev = IommuDevice::new(IommuConfig {
            num_request_queues: u16::try_from(GUESTS).unwrap(),
            ..IommuConfig::default()
        })
        .expect("vIOMMU");
        for g in 0..GUESTS {
            for k in KINDS {
                dev.add_endpoint(k.endpoint(g)).expect("endpoint");
            }
            dev.require_explicit_maps(Kind::Vfio.endpoint(g))
                .expect("VFIO endpoint");
        }
        // Unattached endpoints are blocked (no bypass).
        dev.ack_features(dev.device_features() & !(1 << feature::BYPASS_CONFIG));
        assert_eq!(dev.num_request_queues(), u16::try_from(GUESTS).unwrap());

        // Consumers are invalidated in the order they registered. The
        // IOTLBs come first so that an INVALIDATE follows the table update
        // by microseconds, not by a quiescer's wait: a miss translated just
        // before the UNMAP is then still in flight when it is acknowledged.
        let vhosts = (0..GUESTS)
            .map(|g| VhostPair::new(&dev, &shared, g))
            .collect();
        let quiescer = Quiescer::new();
        dev.add_invalidator(quiescer.clone());
        let spaces = (0..GUESTS)
            .map(|g| {
                let ep = dev.endpoint_dma(Kind::Emulated.endpoint(g)).expect("ep");
                let t = Arc::new(IommuTranslate::new(ep, None));
                DmaSpace::translated(shared.mem.clone(), t).with_quiescer(quiescer.clone())
            })
            .collect();
        // dmavisor's own mirrors over recording containers; guest 0's host
        // has VFIO_UNMAP_ALL, guest 1's not (the mirror's two ways to
        // empty a container).
        let hosts: Vec<Arc<RecordingHost>> = (0..GUESTS)
            .map(|g| Arc::new(RecordingHost::new(g % 2 == 0)))
            .collect();
        let mirrors = hosts
            .iter()
            .enumerate()
            .map(|(g, h)| {
                let m = Arc::new(VfioMirror::new(
                    format!("stress{g}"),
                    Kind::Vfio.endpoint(g),
                    h.clone(),
                    shared.mem.clone(),
                ));
                dev.add_invalidator(m.clone());
                dev.add_map_mirror(m.clone());
                m
            })
            .collect();
        Self {
            shared,
            dev,
            quiescer,
            spaces,
            hosts,
            mirrors,
            vhosts,
        }
    }

    /// Runs every thread for `secs` seconds; returns the seconds it took.
    pub fn run(&self, secs: u64, seed: u64) -> f64 {
        let started = Instant::now();
        let (shared, dev) = (&self.shared, &self.dev);
        let mut n = 0u64;
        let mut next = || {
            n += 1;
            Rng::new(seed, n)
        };
        std::thread::scope(|s| {
            for v in &self.vhosts {
                let (vmm_end, iotlb) = (clone(&v.vmm_end), v.iotlb.clone());
                s.spawn(move || {
                    lowest_priority();
                    serve_backend_channel(vmm_end, iotlb)
                });
                let (cache, sock) = (v.cache.clone(), clone(&v.frontend));
                s.spawn(move || cache.serve_frontend(sock));
                let (cache, chan, rng) = (v.cache.clone(), clone(&v.backend_end), next());
                let hint = &shared.unmap_hints[v.guest];
                s.spawn(move || vhost::run(shared, &cache, chan, hint, rng));
            }
            for _ in 0..DEVICE_THREADS {
                let handles = self
                    .spaces
                    .iter()
                    .map(|sp| ThreadDma::new(sp.clone()).expect("a reader slot"))
                    .collect();
                let rng = next();
                s.spawn(move || emulated::run(shared, handles, rng));
            }
            let (hosts, rng) = (&self.hosts, next());
            s.spawn(move || vfio::run(shared, hosts, rng));
            let guests: Vec<_> = (0..GUESTS)
                .map(|g| {
                    let (h, rng) = (self.hosts[g].clone(), next());
                    s.spawn(move || Guest::new(g, shared, dev, h, rng).run())
                })
                .collect();
            std::thread::sleep(Duration::from_secs(secs));
            shared.stop.store(true, Ordering::SeqCst);
            for g in guests {
                g.join().expect("guest thread");
            }
            // No more invalidations: the back-ends' threads end on the flag
            // or when their sockets close.
            for v in &self.vhosts {
                for sock in [&v.frontend, &v.backend_end, &v.vmm_end] {
                    // Already closed by a thread that ended first: fine.
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            }
        });
        started.elapsed().as_secs_f64()
    }

    fn iotlb_sum(&self, f: impl Fn(&BackendIotlb) -> u64) -> u64 {
        self.vhosts.iter().map(|v| f(&v.iotlb)).sum()
    }

    /// Back-ends and VFIO functions stopped for a failed invalidation.
    pub fn stops(&self) -> (u64, usize) {
        (
            self.iotlb_sum(|i| i.stats.stops.load(Ordering::Relaxed)),
            self.mirrors.iter().filter(|m| m.failed()).count(),
        )
    }

    /// The run's counts, as the JSON line the test prints.
    pub fn report(&self, seed: u64, seconds: f64) -> serde_json::Value {
        let sh = &self.shared;
        let per_kind = |f: fn(&KindStats) -> &AtomicU64| {
            let mut m = serde_json::Map::new();
            for k in KINDS {
                m.insert(
                    k.name().into(),
                    f(sh.kind(k)).load(Ordering::Relaxed).into(),
                );
            }
            serde_json::Value::Object(m)
        };
        let host_sum = |f: fn(&RecordingHost) -> &AtomicU64| {
            self.hosts
                .iter()
                .map(|h| f(h).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let q = self.quiescer.stats();
        let (iotlb_stops, vfio_stops) = self.stops();
        serde_json::json!({
            "test": "dma_protection_stress_native",
            "mutation": std::env::var("DMAVISOR_MUTATION").unwrap_or_default(),
            "mutations_feature": cfg!(feature = "test-mutations"),
            "seed": seed,
            "seconds": (seconds * 10.0).round() / 10.0,
            "guest_threads": GUESTS,
            "device_threads": DEVICE_THREADS,
            "ops": sh.requests.load(Ordering::Relaxed),
            "unmaps": sh.unmaps.load(Ordering::Relaxed),
            "detaches": sh.detaches.load(Ordering::Relaxed),
            "unmap_batches": self.dev.request_counts().invalidation_batches,
            "bad_status": sh.bad_status.load(Ordering::Relaxed),
            "accesses": per_kind(|k| &k.accesses),
            "refused": per_kind(|k| &k.refused),
            "violations": per_kind(|k| &k.violations),
            "violations_total": sh.violations(),
            "violations_after_detach": sh.detach_violations.load(Ordering::Relaxed),
            "quiesce_waits": q.waits,
            "quiesce_waited_for_reader": q.waited_for_reader,
            // Which protocol ran (the process default, sticky where
            // membarrier works), and how often a sticky sync needed its
            // safety net: a device thread of the rig that neither entered
            // again nor parked within the grace period.
            "quiesce_kind": format!("{:?}", self.quiescer.kind()),
            "quiesce_fallbacks": q.fallbacks,
            "iotlb_misses": self.iotlb_sum(|i| i.stats.misses.load(Ordering::Relaxed)),
            "iotlb_invalidations": self.iotlb_sum(|i| i.stats.invalidations.load(Ordering::Relaxed)),
            "iotlb_stale_updates_dropped": self.iotlb_sum(|i| i.stats.stale.load(Ordering::Relaxed)),
            "iotlb_device_stops": iotlb_stops,
            "vfio_map_calls": host_sum(|h| &h.map_calls),
            "vfio_unmap_calls": host_sum(|h| &h.unmap_calls),
            "vfio_functions_stopped": vfio_stops,
        })
    }
}
