/* Structures shared between tcp_links.c and edge_agent/probes/ebpf.py.
 *
 * Python never re-declares these: edge_agent/bpfsys.py builds its ctypes for
 * each map's key and value from this file (and checks their sizes against
 * the kernel's), so this header is the single source of truth.  Keep to
 * what that small parser reads: __u8..__u64 fields, arrays sized by a number
 * or a #define, members of structs declared above.
 * Only our own structs live here; kernel structs come from vmlinux.h (CO-RE
 * build) or are read at offsets taken from the running kernel's BTF (BCC).
 */
#ifndef CFNET_LINKS_H
#define CFNET_LINKS_H

/* RTT histogram: log2 buckets split into 2^CF_SUB_BITS linear sub-buckets,
 * so a bucket is at most 1/16 (6.25 %) of its value wide.  Values below
 * 2^CF_SUB_BITS us get one exact bucket each.  Keep in sync with
 * edge_agent/probes/base.py:bucket_bounds(). */
#define CF_SUB_BITS 4
#define CF_SUB (1 << CF_SUB_BITS)

/* A peer or local address: IPv4 in addr[0..3] (family 2), IPv6 in all 16
 * bytes (family 10).  IPv4-mapped IPv6 addresses are folded to IPv4 so a
 * dual-stack socket and a plain IPv4 socket count for the same peer. */
struct cf_addr {
    __u8 addr[16];
    __u16 family;
    __u16 pad;
};

/* Per-peer aggregates for one interval; Python reads and deletes them. */
struct cf_peer_stats {
    __u64 rtt_count;      /* tcp_probe events that carried an srtt */
    __u64 rtt_sum_us;
    __u64 rtt_min_us;     /* 0 = unset */
    __u64 rtt_max_us;
    __u64 bytes_sent;     /* new data sent (snd_nxt advance) */
    __u64 bytes_acked;    /* data acknowledged by the peer (snd_una advance) */
    __u64 bytes_rcvd;     /* payload received (tcp_probe data_len) */
    __u64 acks;           /* incoming segments that advanced snd_una */
    __u64 segs_in;        /* incoming segments carrying data */
    __u64 retrans;        /* retransmitted segments (tcp_skb_pcount of each skb) */
    __u64 retrans_skbs;   /* tcp_retransmit_skb events (one per skb) */
    __u64 k_segs_out;     /* the kernel's own tcp_sock counters, differenced per socket at */
    __u64 k_retrans;      /* each tcp_probe event (0 unless the loader found BTF offsets) */
    __u64 connects;       /* active opens completed (SYN_SENT -> ESTABLISHED) */
    __u64 connect_ns_sum;
    __u64 opened;         /* connections that reached ESTABLISHED (both sides) */
    __u64 closed;         /* established connections that closed */
    __u64 life_ns_sum;    /* summed lifetime of the closed ones */
    __u64 active_events;  /* events on the active-probe port */
    __u64 passive_events; /* every other event */
};

/* Histogram key: one entry per (peer, bucket) that saw a sample. */
struct cf_hist_key {
    struct cf_addr peer;
    __u32 bucket;
};

/* Per-socket state, keyed by the kernel socket address (an opaque u64: we
 * never dereference it).  Deltas of snd_una/snd_nxt are taken against it. */
struct cf_sock {
    __u64 t_syn_ns;
    __u64 t_est_ns;
    __u32 snd_una;
    __u32 snd_nxt;
    __u32 valid;          /* snd_una/snd_nxt hold a previous sample */
    __u32 k_valid;        /* k_segs_out/k_retrans hold a previous reading */
    __u32 k_segs_out;     /* tcp_sock.segs_out at the last reading */
    __u32 k_retrans;      /* tcp_sock.total_retrans at the last reading */
};

/* Load-time parameters of the CO-RE build: one `const volatile` global in .rodata
 * (cf_cfg, the only thing there), written by edge_agent/libbpf_loader.py before load.
 * The BCC build takes the same parameters as -D flags. */
struct cf_config {
    __u32 filter_local;     /* count an event only if its local address is in local_addrs */
    __u32 include_loopback; /* also count loopback peers */
    __u32 probe_port;       /* port of the active prober's echo server */
    __u32 pad;
};

#endif
