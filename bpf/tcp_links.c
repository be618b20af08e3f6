/* Per-peer TCP link telemetry from tracepoints.
 *
 *  tcp:tcp_probe            smoothed RTT, bytes sent/acked/received (per incoming segment,
 *                           ESTABLISHED sockets only), and the socket's own segs_out and
 *                           total_retrans (what tcp_info reports; loss is their ratio)
 *  tcp:tcp_retransmit_skb   retransmitted segments (ESTABLISHED only, to match); the
 *                           segment count of the skb is read from its tcp_skb_cb
 *  sock:inet_sock_set_state connect latency, connections opened/closed, lifetime
 *
 * Aggregates live in `peers` and `rtt_hist`; edge_agent/probes/ebpf.py reads
 * and deletes them once per interval.
 *
 * One source, two builds (cfnet_compat.h says what differs):
 *  - CO-RE (default): `clang -target bpf -g -O2 -DCFNET_CORE` against vmlinux.h, once, at
 *    build time (tools/build_bpf.py); loaded by libbpf (edge_agent/libbpf_loader.py), which
 *    relocates the tracepoint records and the three kernel struct reads against the running
 *    kernel's BTF.  Parameters: struct cf_config in .rodata, set before load; map sizes by
 *    bpf_map__set_max_entries.
 *  - BCC (fallback for kernels without BTF): compiled on the device; -D parameters:
 *      CFNET_FILTER_LOCAL, CFNET_INCLUDE_LOOPBACK, CFNET_PROBE_PORT (as struct cf_config),
 *      CFNET_RETRANS_HAS_ERR   tcp_retransmit_skb has an `err` field (from its tracefs format)
 *      CFNET_MAX_PEERS / CFNET_MAX_SOCKS   map sizes
 *      CFNET_SKB_CB_OFF, CFNET_TCB_GSO_SEGS_OFF, CFNET_TP_SEGS_OUT_OFF,
 *      CFNET_TP_TOTAL_RETRANS_OFF   kernel struct offsets, from /sys/kernel/btf/vmlinux when
 *                           there is one (never from the headers BCC compiles against, which
 *                           may be another kernel's).  Unset: one retransmitted segment per
 *                           skb, and no kernel counters (Python estimates segs_out).
 */
#include "cfnet_compat.h"

#ifndef CFNET_MAX_PEERS
#define CFNET_MAX_PEERS 4096
#endif
#ifndef CFNET_MAX_SOCKS
#define CFNET_MAX_SOCKS 65536
#endif

#define CF_AF_INET 2
#define CF_AF_INET6 10
#define CF_IPPROTO_TCP 6
#define CF_TCP_ESTABLISHED 1
#define CF_TCP_SYN_SENT 2
#define CF_TCP_CLOSE 7

CF_HASH(peers, struct cf_addr, struct cf_peer_stats, CFNET_MAX_PEERS);
CF_HASH(rtt_hist, struct cf_hist_key, u64, CFNET_MAX_PEERS * 16);
/* LRU: a socket whose close we missed (opened before load) ages out. */
CF_LRU_HASH(socks, u64, struct cf_sock, CFNET_MAX_SOCKS);
CF_HASH(local_addrs, struct cf_addr, u8, 1024);

#ifndef CFNET_CORE
/* The BCC build's map operations (see CF_LOOKUP in cfnet_compat.h). */
static __always_inline struct cf_sock *cf_bcc_socks_lookup(u64 *k) { return socks.lookup(k); }
static __always_inline int cf_bcc_socks_update(u64 *k, struct cf_sock *v)
{
    return socks.update(k, v);
}
static __always_inline int cf_bcc_socks_delete(u64 *k) { return socks.delete(k); }
static __always_inline u8 *cf_bcc_local_addrs_lookup(struct cf_addr *k)
{
    return local_addrs.lookup(k);
}
static __always_inline struct cf_peer_stats *
cf_bcc_peers_lookup_or_init(const struct cf_addr *k, struct cf_peer_stats *zero)
{
    return peers.lookup_or_try_init((struct cf_addr *)k, zero);
}
static __always_inline u64 *cf_bcc_rtt_hist_lookup_or_init(struct cf_hist_key *k, u64 *zero)
{
    return rtt_hist.lookup_or_try_init(k, zero);
}
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CF_BE32(x) __builtin_bswap32(x)
#else
#define CF_BE32(x) (x)
#endif

/* Fold IPv4-mapped IPv6 (::ffff:a.b.c.d) to IPv4.  Word compares, not byte
 * loops: fewer branches for the verifier to walk and for every event to take. */
static __always_inline void cf_fold_mapped(struct cf_addr *a)
{
    if (a->family != CF_AF_INET6)
        return;
    u32 w[4];
    __builtin_memcpy(w, a->addr, 16);
    if (w[0] | w[1] | (w[2] ^ CF_BE32(0x0000ffff)))
        return;
    __builtin_memset(a->addr, 0, 16);
    __builtin_memcpy(a->addr, &w[3], 4);
    a->family = CF_AF_INET;
}

static __always_inline int cf_is_loopback(const struct cf_addr *a)
{
    if (a->family == CF_AF_INET)
        return a->addr[0] == 127;
    u32 w[4];
    __builtin_memcpy(w, a->addr, 16);
    return !(w[0] | w[1] | w[2] | (w[3] ^ CF_BE32(1)));
}

static __always_inline int cf_wanted(struct cf_addr *local, const struct cf_addr *peer)
{
    if (!CF_INCLUDE_LOOPBACK && cf_is_loopback(peer))
        return 0;
    /* Tracepoints fire for every network namespace: the local address set
     * is how an agent in one namespace counts only its own sockets. */
    if (CF_FILTER_LOCAL && !CF_LOOKUP(local_addrs, local))
        return 0;
    return 1;
}

/* The local and peer address of a sock:inet_sock_set_state or tcp:tcp_retransmit_skb
 * record: both carry saddr/daddr (IPv4) and saddr_v6/daddr_v6.  0: not an inet family. */
static __always_inline int cf_addrs_from_tp(struct cf_addr *local, struct cf_addr *peer,
                                            u16 family, const void *saddr, const void *daddr,
                                            const void *saddr_v6, const void *daddr_v6)
{
    if (family == CF_AF_INET) {
        bpf_probe_read_kernel(local->addr, 4, saddr);
        bpf_probe_read_kernel(peer->addr, 4, daddr);
    } else if (family == CF_AF_INET6) {
        bpf_probe_read_kernel(local->addr, 16, saddr_v6);
        bpf_probe_read_kernel(peer->addr, 16, daddr_v6);
    } else {
        return 0;
    }
    local->family = family;
    peer->family = family;
    cf_fold_mapped(local);
    cf_fold_mapped(peer);
    return 1;
}

/* tcp_probe carries addresses as a sockaddr_in / sockaddr_in6 (UAPI layout: sin_addr at 4,
 * sin6_addr at 8) inside its record, which is the program's context: the bytes are read
 * straight from it, loads at constant offsets (all a tracepoint context allows), where a
 * bpf_probe_read_kernel of the 28-byte sockaddr was a helper call per address per event
 * (the in-kernel cost per segment).  0: not an inet family. */
/* One element each, with a constant index, so that CO-RE relocates each load's offset (a
 * loop would relocate the array's base into a register first: a modified context pointer,
 * which the verifier refuses). */
#define CF_B4(a, f, d, s)                                                                    \
    (a)->addr[d] = args->f[s], (a)->addr[d + 1] = args->f[s + 1],                            \
    (a)->addr[d + 2] = args->f[s + 2], (a)->addr[d + 3] = args->f[s + 3]
#define CF_FROM_SOCKADDR(a, f, fam)                                                          \
    ({                                                                                       \
        int ok_ = 1;                                                                         \
        (a)->family = (fam);                                                                 \
        if ((fam) == CF_AF_INET) {                                                           \
            CF_B4(a, f, 0, 4);                                                               \
        } else if ((fam) == CF_AF_INET6) {                                                   \
            CF_B4(a, f, 0, 8), CF_B4(a, f, 4, 12), CF_B4(a, f, 8, 16), CF_B4(a, f, 12, 20);  \
            cf_fold_mapped(a);                                                               \
        } else {                                                                             \
            ok_ = 0;                                                                         \
        }                                                                                    \
        ok_;                                                                                 \
    })

static __always_inline u64 cf_delta(u32 now, u32 before)
{
    s32 d = (s32)(now - before);
    /* A negative step (snd_nxt pulled back after an RTO) is not progress. */
    return d > 0 ? (u64)d : 0;
}

static __always_inline u32 cf_log2(u64 v)
{
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8)  { v >>= 8;  r += 8; }
    if (v >> 4)  { v >>= 4;  r += 4; }
    if (v >> 2)  { v >>= 2;  r += 2; }
    if (v >> 1)  { r += 1; }
    return r;
}

static __always_inline u32 cf_bucket(u64 v)
{
    if (v < CF_SUB)
        return (u32)v;
    u32 l = cf_log2(v);
    u32 sub = (u32)(v >> (l - CF_SUB_BITS)) & (CF_SUB - 1);
    return (l - CF_SUB_BITS + 1) * CF_SUB + sub;
}

static __always_inline void cf_mark(struct cf_peer_stats *st, u16 sport, u16 dport)
{
    if (sport == CF_PROBE_PORT || dport == CF_PROBE_PORT)
        __sync_fetch_and_add(&st->active_events, 1);
    else
        __sync_fetch_and_add(&st->passive_events, 1);
}

CF_TRACEPOINT(tcp, tcp_probe, struct trace_event_raw_tcp_probe)
{
    struct cf_addr local = {}, peer = {};
    u16 family = args->family;

    /* Most events on a busy host can be other sockets' (the receiving end of
     * a local flow, other namespaces): the local address alone decides, so
     * it is read and checked before the peer's is read at all. */
    if (!CF_FROM_SOCKADDR(&local, saddr, family))
        return 0;
    if (CF_FILTER_LOCAL && !CF_LOOKUP(local_addrs, &local))
        return 0;
    CF_FROM_SOCKADDR(&peer, daddr, family);
    if (!CF_INCLUDE_LOOPBACK && cf_is_loopback(&peer))
        return 0;

    u64 sk = (u64)args->skaddr;
    u32 una = args->snd_una, nxt = args->snd_nxt;
    u64 acked = 0, sent = 0, ksegs_d = 0, kret_d = 0;
    u32 ksegs = 0, kret = 0;
    /* The kernel's own per-socket counters (what tcp_info reports as segs_out
     * and total_retrans), so the loss ratio is the kernel's, whatever GSO, RTO or
     * SACK recovery did.  CO-RE: relocated field reads; BCC: offsets from BTF. */
#ifdef CFNET_CORE
    const struct tcp_sock *tp = (const struct tcp_sock *)args->skaddr;
    ksegs = BPF_CORE_READ(tp, segs_out);
    kret = BPF_CORE_READ(tp, total_retrans);
#elif CF_KERNEL_COUNTERS
    bpf_probe_read_kernel(&ksegs, sizeof(ksegs), (const u8 *)args->skaddr + CFNET_TP_SEGS_OUT_OFF);
    bpf_probe_read_kernel(&kret, sizeof(kret),
                          (const u8 *)args->skaddr + CFNET_TP_TOTAL_RETRANS_OFF);
#endif
    int have_k = CF_KERNEL_COUNTERS;
    struct cf_sock *s = CF_LOOKUP(socks, &sk);
    if (s) {
        if (s->valid) {
            acked = cf_delta(una, s->snd_una);
            sent = cf_delta(nxt, s->snd_nxt);
        }
        if (s->k_valid) {
            ksegs_d = cf_delta(ksegs, s->k_segs_out);
            kret_d = cf_delta(kret, s->k_retrans);
        }
        s->snd_una = una;
        s->snd_nxt = nxt;
        s->valid = 1;
        s->k_segs_out = ksegs;
        s->k_retrans = kret;
        s->k_valid = have_k;
    } else {
        /* A socket we did not see open: this reading is its baseline. */
        struct cf_sock fresh = {};
        fresh.snd_una = una;
        fresh.snd_nxt = nxt;
        fresh.valid = 1;
        fresh.k_segs_out = ksegs;
        fresh.k_retrans = kret;
        fresh.k_valid = have_k;
        CF_UPDATE(socks, &sk, &fresh);
    }

    struct cf_peer_stats zero = {};
    struct cf_peer_stats *st = CF_LOOKUP_OR_INIT(peers, &peer, &zero);
    if (!st)
        return 0;
    cf_mark(st, args->sport, args->dport);
    if (acked) {
        __sync_fetch_and_add(&st->bytes_acked, acked);
        __sync_fetch_and_add(&st->acks, 1);
    }
    if (sent)
        __sync_fetch_and_add(&st->bytes_sent, sent);
    if (ksegs_d)
        __sync_fetch_and_add(&st->k_segs_out, ksegs_d);
    if (kret_d)
        __sync_fetch_and_add(&st->k_retrans, kret_d);
    u32 dlen = args->data_len;
    if (dlen) {
        __sync_fetch_and_add(&st->bytes_rcvd, dlen);
        __sync_fetch_and_add(&st->segs_in, 1);
    }

    /* tp->srtt_us holds 8 x the smoothed RTT, but the tracepoint stores it
     * already shifted (srtt_us >> 3): the field is in microseconds.  Checked
     * against tcp_info's tcpi_rtt by tests/integration/test_probe_accuracy.py. */
    u64 rtt = args->srtt;
    if (!rtt)
        return 0;
    __sync_fetch_and_add(&st->rtt_count, 1);
    __sync_fetch_and_add(&st->rtt_sum_us, rtt);
    /* min/max races between CPUs only lose a sample's extremum; no atomics exist for them. */
    if (!st->rtt_min_us || rtt < st->rtt_min_us)
        st->rtt_min_us = rtt;
    if (rtt > st->rtt_max_us)
        st->rtt_max_us = rtt;

    struct cf_hist_key hk = {};
    hk.peer = peer;
    hk.bucket = cf_bucket(rtt);
    u64 one = 0;
    u64 *c = CF_LOOKUP_OR_INIT(rtt_hist, &hk, &one);
    if (c)
        __sync_fetch_and_add(c, 1);
    return 0;
}

#ifdef CFNET_CORE
/* Kernels before 6.10 record tcp_retransmit_skb in the shared tcp_event_sk_skb class (no
 * `err` field); the ___old flavour names that layout for CO-RE, and whichever of the two
 * the running kernel has is used (libbpf resolves bpf_core_type_exists at load). */
struct trace_event_raw_tcp_event_sk_skb___old {
    const void *skbaddr;
    const void *skaddr;
    int state;
    __u16 sport;
    __u16 dport;
    __u16 family;
    __u8 saddr[4];
    __u8 daddr[4];
    __u8 saddr_v6[16];
    __u8 daddr_v6[16];
} __attribute__((preserve_access_index));
#endif

/* The body of tcp:tcp_retransmit_skb, for either record layout. */
#define CF_RETRANSMIT_BODY(args, has_err)                                                    \
    struct cf_addr local = {}, peer = {};                                                    \
    /* tcp_probe (our bytes-sent count) fires only in ESTABLISHED; retransmits after      \
     * close() (FIN_WAIT1 draining the send buffer) would have no denominator and inflate \
     * the loss ratio, so they are left out too. */                                         \
    if (args->state != CF_TCP_ESTABLISHED)                                                   \
        return 0;                                                                            \
    /* Kernels >= 6.x also trace failed attempts (e.g. -EBUSY while the original is     \
     * still in a local queue); tcp_info counts only real ones. */                          \
    if (has_err)                                                                             \
        return 0;                                                                            \
    if (!cf_addrs_from_tp(&local, &peer, args->family, args->saddr, args->daddr,            \
                          args->saddr_v6, args->daddr_v6))                                   \
        return 0;                                                                            \
    if (!cf_wanted(&local, &peer))                                                           \
        return 0;                                                                            \
    return cf_count_retransmit(&peer, args->sport, args->dport, (const void *)args->skbaddr)

static __always_inline int cf_count_retransmit(const struct cf_addr *peer, u16 sport,
                                               u16 dport, const void *skbaddr)
{
    struct cf_peer_stats zero = {};
    struct cf_peer_stats *st = CF_LOOKUP_OR_INIT(peers, peer, &zero);
    if (!st)
        return 0;
    cf_mark(st, sport, dport);
    /* With GSO/TSO an skb in the retransmit queue carries several segments,
     * and tcp_info's total_retrans (the figure loss is judged against) adds
     * tcp_skb_pcount(skb) per retransmit.  Counting events undercounts loss by
     * the mean segments per retransmitted skb (2-7x seen on veth with TSO). */
    u64 segs = 1;
    u16 pcount = 0;
#ifdef CFNET_CORE
    const struct sk_buff *skb = (const struct sk_buff *)skbaddr;
    const struct tcp_skb_cb *tcb =
        (const struct tcp_skb_cb *)((const u8 *)skb + bpf_core_field_offset(skb->cb));
    pcount = BPF_CORE_READ(tcb, tcp_gso_segs);
#elif defined(CFNET_SKB_CB_OFF) && defined(CFNET_TCB_GSO_SEGS_OFF)
    bpf_probe_read_kernel(&pcount, sizeof(pcount),
                          (const u8 *)skbaddr + CFNET_SKB_CB_OFF + CFNET_TCB_GSO_SEGS_OFF);
#endif
    /* tcp_gso_segs is 0 only for an skb never sized (not in a retransmit queue). */
    if (pcount > 1)
        segs = pcount;
    __sync_fetch_and_add(&st->retrans, segs);
    __sync_fetch_and_add(&st->retrans_skbs, 1);
    return 0;
}

#ifdef CFNET_CORE
SEC("tp/tcp/tcp_retransmit_skb")
int cf_tcp_retransmit_skb(void *ctx)
{
    if (bpf_core_type_exists(struct trace_event_raw_tcp_retransmit_skb)) {
        struct trace_event_raw_tcp_retransmit_skb *args = ctx;
        CF_RETRANSMIT_BODY(args, bpf_core_field_exists(args->err) && args->err != 0);
    } else {
        struct trace_event_raw_tcp_event_sk_skb___old *args = ctx;
        CF_RETRANSMIT_BODY(args, 0);
    }
}
#else
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
#ifdef CFNET_RETRANS_HAS_ERR
    CF_RETRANSMIT_BODY(args, args->err != 0);
#else
    CF_RETRANSMIT_BODY(args, 0);
#endif
}
#endif

CF_TRACEPOINT(sock, inet_sock_set_state, struct trace_event_raw_inet_sock_set_state)
{
    if (args->protocol != CF_IPPROTO_TCP)
        return 0;
    int newstate = args->newstate, oldstate = args->oldstate;
    u64 sk = (u64)args->skaddr;
    u64 now = bpf_ktime_get_ns();

    if (newstate == CF_TCP_SYN_SENT) {
        struct cf_sock fresh = {};
        fresh.t_syn_ns = now;
        CF_UPDATE(socks, &sk, &fresh);
        return 0;
    }
    if (newstate != CF_TCP_ESTABLISHED && newstate != CF_TCP_CLOSE)
        return 0;

    struct cf_sock *s = CF_LOOKUP(socks, &sk);
    if (newstate == CF_TCP_CLOSE && !s)
        return 0;

    struct cf_addr local = {}, peer = {};
    if (!cf_addrs_from_tp(&local, &peer, args->family, args->saddr, args->daddr,
                          args->saddr_v6, args->daddr_v6))
        return 0;
    int wanted = cf_wanted(&local, &peer);

    if (newstate == CF_TCP_CLOSE) {
        if (wanted && s && s->t_est_ns) {
            struct cf_peer_stats zero = {};
            struct cf_peer_stats *st = CF_LOOKUP_OR_INIT(peers, &peer, &zero);
            if (st) {
                __sync_fetch_and_add(&st->closed, 1);
                __sync_fetch_and_add(&st->life_ns_sum, now - s->t_est_ns);
            }
        }
        CF_DELETE(socks, &sk);
        return 0;
    }

    /* ESTABLISHED */
    if (!wanted) {
        if (s)
            CF_DELETE(socks, &sk);
        return 0;
    }
    struct cf_peer_stats zero = {};
    struct cf_peer_stats *st = CF_LOOKUP_OR_INIT(peers, &peer, &zero);
    if (!st)
        return 0;
    cf_mark(st, args->sport, args->dport);
    __sync_fetch_and_add(&st->opened, 1);
    /* Seen from its start: the kernel counters' baseline is zero, as in
     * tcp_info, so the handshake's segments count too. */
    if (s) {
        if (oldstate == CF_TCP_SYN_SENT && s->t_syn_ns && now > s->t_syn_ns) {
            __sync_fetch_and_add(&st->connects, 1);
            __sync_fetch_and_add(&st->connect_ns_sum, now - s->t_syn_ns);
        }
        s->t_est_ns = now;
        s->k_segs_out = 0;
        s->k_retrans = 0;
        s->k_valid = 1;
    } else {
        struct cf_sock fresh = {};
        fresh.t_est_ns = now;
        fresh.k_valid = 1;
        CF_UPDATE(socks, &sk, &fresh);
    }
    return 0;
}
