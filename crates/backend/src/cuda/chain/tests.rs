//! The chain's recording and ring, checked on the CPU: instruction layout, K parts, the
//! recorder against the ops run one by one under random block orders, the ring's parity
//! waits under random schedules.

use super::*;

#[test]
fn layout_is_the_kernels() {
    // chain.cu: 11 u64, 14 u32, 2 u64 an instruction; MAXI of them, two u64 and two
    // u32, within the 4 KB of parameters every driver takes.
    assert_eq!(std::mem::size_of::<Ins>(), 160);
    assert_eq!(std::mem::size_of::<Args>(), 160 * MAXI + 24);
    assert!(std::mem::size_of::<Args>() <= 4096);
}

#[test]
fn pairs_put_small_matrices_beside_large_ones() {
    // A DeltaNet's in-projections: qkv, z, β, α.
    let q1 = [Q1_0R; 4];
    assert_eq!(
        pairs(&[10240, 6144, 48, 48], &q1),
        vec![(0, Some(3)), (1, Some(2))]
    );
    assert_eq!(
        pairs(&[4096, 1024, 1024], &q1),
        vec![(0, Some(2)), (1, None)]
    );
    assert_eq!(pairs(&[64], &q1), vec![(0, None)]);
    // Formats pair only with their own.
    assert_eq!(
        pairs(&[512, 256, 128], &[Q1_0R, Q4_K, Q4_K]),
        vec![(0, None), (1, Some(2))]
    );
}

#[test]
fn parts_fill_the_warps_rounds() {
    // 27B on 132 SMs: out-proj and down (320 tiles) 3 parts (7.3 units a block, one
    // round), qkv (640) 3, the head (15,520) 1, a part at least a group.
    assert_eq!(chain_parts(132, 8, 320, 6), 3);
    assert_eq!(chain_parts(132, 8, 640, 5), 3);
    assert_eq!(chain_parts(132, 8, 15_520, 5), 1);
    assert_eq!(chain_parts(132, 8, 6, 1), 1);
    // 16 warps: a round holds twice the units.
    assert_eq!(chain_parts(132, 16, 320, 6), 6);
}

#[test]
fn spans_overlap_only_where_they_share_bytes() {
    assert!(overlaps(&[(0, 8)], &[(4, 12)]));
    assert!(!overlaps(&[(0, 8)], &[(8, 12)]));
    assert!(!overlaps(&[], &[(0, 1)]));
}

/// f32 buffers at fake device addresses (4 bytes a value from 4096), dense matrices by
/// address, and the ops' and instructions' arithmetic on them (the kernel's q8_1 and
/// tensor cores aside: exact f32 here, the same in the reference and the chains).
#[derive(Clone, Default)]
struct Mem {
    v: Vec<f32>,
    mats: std::collections::HashMap<u64, (usize, usize, Vec<f32>)>,
}

impl Mem {
    fn buf(&mut self, n: usize, seed: u64) -> Span {
        let a = 4096 + 4 * self.v.len() as u64;
        self.v
            .extend((0..n).map(|i| ((i as u64 * 7 + seed * 13) % 17) as f32 / 8.0 - 1.0));
        (a, a + 4 * n as u64)
    }
    fn mat(&mut self, rows: usize, k: usize, seed: u64) -> u64 {
        let a = (1 << 40) + ((self.mats.len() as u64) << 32);
        let w = (0..rows * k)
            .map(|i| ((i as u64 * 31 + seed * 7) % 13) as f32 / 16.0 - 0.4)
            .collect();
        self.mats.insert(a, (rows, k, w));
        a
    }
    fn at(&self, p: u64) -> usize {
        ((p - 4096) / 4) as usize
    }
    fn get(&self, p: u64, n: usize) -> Vec<f32> {
        let i = self.at(p);
        self.v[i..i + n].to_vec()
    }
    fn set(&mut self, p: u64, v: &[f32]) {
        let i = self.at(p);
        self.v[i..i + v.len()].copy_from_slice(v);
    }
    fn gemv(&self, w: u64, x: &[f32]) -> Vec<f32> {
        let (rows, k, m) = &self.mats[&w];
        (0..*rows)
            .map(|r| (0..*k).map(|c| m[r * k + c] * x[c]).sum())
            .collect()
    }
}

fn norm(x: &[f32], y: Option<&[f32]>, g: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let s: Vec<f32> = match y {
        Some(y) => x.iter().zip(y).map(|(a, b)| a + b).collect(),
        None => x.to_vec(),
    };
    let t: f64 = s.iter().map(|&v| v as f64 * v as f64).sum();
    let scale = 1.0 / ((t / s.len() as f64) as f32 + eps).sqrt();
    let out = s.iter().zip(g).map(|(v, w)| v * scale * w).collect();
    (s, out)
}

fn silu_mul(v: f32, u: f32) -> f32 {
    v / (1.0 + (-v).exp()) * u
}

/// Values to write at an address.
type Writes = Vec<(u64, Vec<f32>)>;

/// An instruction's reads (what it computes from) and writes, as the kernel does its
/// block `b` of `nb`'s share: rows (GEMV, GLU), a slice (ADD, the norm's output), all
/// (block 0's norms). Returns the writes (address, values).
fn step(m: &Mem, i: &Ins, b: usize, nb: usize) -> Writes {
    let k = i.k as usize;
    let slice = |n: usize| (n * b / nb, n * (b + 1) / nb);
    let mut w = Vec::new();
    match i.kind {
        GEMV | GLU => {
            let input = if i.norm > 0 {
                let ny = (i.norm == 2).then(|| m.get(i.ny, k));
                let (_, o) = norm(&m.get(i.nx, k), ny.as_deref(), &m.get(i.gamma, k), i.eps);
                if i.mat == 1 {
                    let (a, e) = slice(k);
                    w.push((i.x + 4 * a as u64, o[a..e].to_vec()));
                }
                o
            } else {
                m.get(i.x, k)
            };
            let rows = i.rows as usize;
            let (a, e) = slice(rows);
            if i.kind == GEMV {
                // Two matrices: w0's rows, then w1's, into o0 and o1.
                let mut y = m.gemv(i.w0, &input);
                if i.w1 != 0 {
                    y.extend(m.gemv(i.w1, &input));
                }
                let r0 = if i.w1 != 0 { i.rows0 as usize } else { rows };
                if a < r0 {
                    w.push((i.o0 + 4 * a as u64, y[a..e.min(r0)].to_vec()));
                }
                if e > r0 {
                    let a1 = a.max(r0);
                    w.push((i.o1 + 4 * (a1 - r0) as u64, y[a1..e].to_vec()));
                }
            } else {
                let (g, u) = (m.gemv(i.w0, &input), m.gemv(i.w1, &input));
                let gg = (a..e).map(|r| silu_mul(g[r], u[r])).collect();
                w.push((i.o0 + 4 * a as u64, gg));
                w.push((i.o1 + 4 * a as u64, u[a..e].to_vec()));
            }
        }
        ADD => {
            let (a, e) = slice(k);
            let (x, y) = (m.get(i.x, k), m.get(i.y, k));
            w.push((i.x + 4 * a as u64, (a..e).map(|j| x[j] + y[j]).collect()));
        }
        ADD_NORM | NORM if b == 0 => {
            let y = (i.kind == ADD_NORM).then(|| m.get(i.y, k));
            let (s, o) = norm(&m.get(i.x, k), y.as_deref(), &m.get(i.gamma, k), i.eps);
            if i.kind == ADD_NORM {
                w.push((i.x, s));
            }
            w.push((i.o0, o));
        }
        _ => {}
    }
    w
}

/// A seeded xorshift draw in 0..n (the random schedules and block orders below).
fn xorshift(seed: u64) -> impl FnMut(usize) -> usize {
    let mut rng = seed.max(1);
    move |n| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    }
}

/// The ring as chain.cu runs it, one block, in random schedules: the producer fills
/// seq into slot seq % ns once the reader of seq − ns has released it; warp w reads
/// seq = base + c·nu + w of each round of nu units; both wait by mbarrier parity (`full`, `empty`
/// count completed phases; a wait for parity p passes while the count's parity is not
/// p). Returns the reads that passed before their fill and whether it ran to the end.
fn ring(warps: usize, ns: usize, units: usize, nch: usize, seed: u64) -> (usize, bool) {
    let mut rand = xorshift(seed);
    // chain.cu's rounds (CnGeo::round): W units at a time.
    let mut prog = vec![Vec::new(); warps];
    let (mut base, mut ub) = (0, 0);
    while ub < units {
        let nu = warps.min(units - ub);
        for (w, prg) in prog.iter_mut().enumerate().take(nu) {
            prg.extend((0..nch).map(|c| base + c * nu + w));
        }
        base += nch * nu;
        ub += nu;
    }
    let (mut full, mut empty) = (vec![0usize; ns], vec![0usize; ns]);
    let (mut pc, mut held) = (vec![0usize; warps], vec![None::<usize>; warps]);
    let (mut fill, mut early) = (0, 0);
    loop {
        // 0: the producer; 1 + w: warp w reads or releases.
        let can: Vec<usize> = (0..=warps)
            .filter(|&a| match a {
                0 => fill < base && (fill < ns || empty[fill % ns] % 2 != (fill / ns - 1) % 2),
                _ => {
                    let w = a - 1;
                    held[w].is_some()
                        || prog[w]
                            .get(pc[w])
                            .is_some_and(|&x| full[x % ns] % 2 != (x / ns) % 2)
                }
            })
            .collect();
        if can.is_empty() {
            let done =
                fill == base && (0..warps).all(|w| pc[w] == prog[w].len() && held[w].is_none());
            return (early, done);
        }
        match can[rand(can.len())] {
            0 => {
                full[fill % ns] += 1;
                fill += 1;
            }
            a => {
                let w = a - 1;
                if let Some(x) = held[w].take() {
                    empty[x % ns] += 1;
                } else {
                    let x = prog[w][pc[w]];
                    early += usize::from(full[x % ns] < x / ns + 1);
                    held[w] = Some(x);
                    pc[w] += 1;
                }
            }
        }
    }
}

/// The kernel's shape keeps the parity waits sound (warps ≤ slots) and runs to the end; 16
/// warps on 14 slots (session 33's hang) does neither.
#[test]
fn ring_waits_pass_only_after_their_fill() {
    // Last rounds of 5, 2 and 3 units, and one unit alone.
    for units in [37, 34, 35, 1] {
        for seed in 1..100 {
            assert_eq!(
                ring(WARPS, SLOTS, units, 3, seed),
                (0, true),
                "{units} units"
            );
        }
    }
    assert!((1..50).all(|seed| ring(16, 14, 37, 3, seed) != (0, true)));
}

/// Runs chains as `nb` blocks would, in a random order that only the deps constrain:
/// each block takes the instructions in order; one reads its inputs once the counters of
/// its deps are full, and writes later, at a moment of its own.
fn run_blocks(m: &mut Mem, chains: &[Vec<Ins>], nb: usize, seed: u64) {
    let mut rand = xorshift(seed);
    for ins in chains {
        let single = |i: &Ins| i.kind == ADD_NORM || i.kind == NORM;
        let mut cnt = vec![0usize; ins.len()];
        // Per block: the next instruction, and the writes it computed (read done).
        let mut next = vec![0usize; nb];
        let mut pending: Vec<Option<Writes>> = vec![None; nb];
        while next.iter().any(|&n| n < ins.len()) {
            let b = rand(nb);
            let o = next[b];
            if o == ins.len() {
                continue;
            }
            let i = &ins[o];
            if single(i) && b != 0 {
                next[b] += 1;
                continue;
            }
            match pending[b].take() {
                None => {
                    let ready = (0..o)
                        .filter(|j| i.deps & (1 << j) != 0)
                        .all(|j| cnt[j] == if single(&ins[j]) { 1 } else { nb });
                    if ready {
                        pending[b] = Some(step(m, i, b, nb));
                    }
                }
                Some(w) => {
                    for (p, v) in w {
                        m.set(p, &v);
                    }
                    cnt[o] += 1;
                    next[b] += 1;
                }
            }
        }
    }
}

/// A hybrid layer's ops as the model calls them, then a GEMV the chain does not take
/// (ends it), an add, a norm and a GEMV of that: recorded (norms folded or not; the two
/// in-projections as two GEMVs or as one of two matrices), the chains run in one order and
/// in many random orders of 5 blocks give the ops' results run one by one, exactly.
#[test]
fn recorded_chains_equal_the_ops_in_any_block_order() {
    let (h, f, f2) = (24, 40, 32);
    let mut m = Mem::default();
    let x = m.buf(h, 1);
    let core = m.buf(f2, 2);
    let g1 = m.buf(h, 3);
    let g2 = m.buf(h, 4);
    let (o, xn, g, u, o2, xn2, qa, qb, p, xf, head) = (
        m.buf(h, 0),
        m.buf(h, 0),
        m.buf(f, 0),
        m.buf(f, 0),
        m.buf(h, 0),
        m.buf(h, 0),
        m.buf(2 * h, 0),
        m.buf(16, 0),
        m.buf(h, 0),
        m.buf(h, 0),
        m.buf(2 * h, 0),
    );
    let (wo, wg, wu, wd, wa, wb, wq) = (
        m.mat(h, f2, 1),
        m.mat(f, h, 2),
        m.mat(f, h, 3),
        m.mat(h, f, 4),
        m.mat(2 * h, h, 5),
        m.mat(16, h, 6),
        m.mat(h, h, 7),
    );
    let gemv = |w: u64, x: Span, o: Span, rows: usize, k: usize, nkc: u32| Ins {
        kind: GEMV,
        w0: w,
        x: x.0,
        o0: o.0,
        rows: rows as u32,
        k: k as u32,
        nkc,
        ..Ins::default()
    };
    let nrm = |kind: u32, x: Span, y: Option<Span>, gm: Span, out: Span| Ins {
        kind,
        x: x.0,
        y: y.map_or(0, |y| y.0),
        o0: out.0,
        gamma: gm.0,
        k: h as u32,
        eps: 1e-6,
        ..Ins::default()
    };
    // The ops one by one.
    let mut want = m.clone();
    let mv = |m: &mut Mem, w: u64, x: Span, o: Span, k: usize| {
        let r = m.gemv(w, &m.get(x.0, k));
        m.set(o.0, &r);
    };
    let add_norm = |m: &mut Mem, x: Span, y: Option<Span>, gm: Span, out: Span| {
        let yv = y.map(|y| m.get(y.0, h));
        let (s, n) = norm(&m.get(x.0, h), yv.as_deref(), &m.get(gm.0, h), 1e-6);
        if y.is_some() {
            m.set(x.0, &s);
        }
        m.set(out.0, &n);
    };
    {
        let w = &mut want;
        mv(w, wo, core, o, f2);
        add_norm(w, x, Some(o), g1, xn);
        let xs = w.get(xn.0, h);
        let (gv, uv) = (w.gemv(wg, &xs), w.gemv(wu, &xs));
        let gg: Vec<f32> = gv.iter().zip(&uv).map(|(a, b)| silu_mul(*a, *b)).collect();
        w.set(g.0, &gg);
        w.set(u.0, &uv);
        mv(w, wd, g, o2, f);
        add_norm(w, x, Some(o2), g2, xn2);
        mv(w, wa, xn2, qa, h);
        mv(w, wb, xn2, qb, h);
        mv(w, wq, xn2, p, h);
        let (xv, pv) = (w.get(x.0, h), w.get(p.0, h));
        w.set(
            x.0,
            &xv.iter().zip(&pv).map(|(a, b)| a + b).collect::<Vec<_>>(),
        );
        add_norm(w, x, None, g1, xf);
        mv(w, wa, xf, head, h);
    }
    for (fold, pair) in [(true, false), (false, false), (true, true), (false, true)] {
        // Recorded as the backend does; the Q8_0-like GEMV (wq) runs between chains.
        let mut r = Recorder::new(fold);
        let mut done = Vec::new();
        let d = &mut done;
        r.push(gemv(wo, core, o, h, f2, 3), vec![core], vec![o], d);
        r.norm(nrm(ADD_NORM, x, Some(o), g1, xn), x, Some(o), xn, d);
        let glu = Ins {
            kind: GLU,
            w0: wg,
            w1: wu,
            x: xn.0,
            o0: g.0,
            o1: u.0,
            rows: f as u32,
            k: h as u32,
            nkc: 1,
            ..Ins::default()
        };
        r.push(glu, vec![xn], vec![g, u], d);
        r.push(gemv(wd, g, o2, h, f, 2), vec![g], vec![o2], d);
        r.norm(nrm(ADD_NORM, x, Some(o2), g2, xn2), x, Some(o2), xn2, d);
        if pair {
            let ab = Ins {
                w1: wb,
                o1: qb.0,
                rows: (2 * h + 16) as u32,
                rows0: (2 * h) as u32,
                ..gemv(wa, xn2, qa, 2 * h, h, 2)
            };
            r.push(ab, vec![xn2], vec![qa, qb], d);
        } else {
            r.push(gemv(wa, xn2, qa, 2 * h, h, 1), vec![xn2], vec![qa], d);
            r.push(gemv(wb, xn2, qb, 16, h, 1), vec![xn2], vec![qb], d);
        }
        r.flush(d);
        let first = d.len();
        let add = Ins {
            kind: ADD,
            x: x.0,
            y: p.0,
            k: h as u32,
            ..Ins::default()
        };
        r.push(add, vec![x, p], vec![x], d);
        r.norm(nrm(NORM, x, None, g1, xf), x, None, xf, d);
        r.push(gemv(wa, xf, head, 2 * h, h, 1), vec![xf], vec![head], d);
        r.flush(d);
        assert_eq!((first, done.len()), (1, 2), "fold {fold}: chains");
        eprintln!("fold {fold} pair {pair}: {}", trace(&done[0]));
        if fold && pair {
            let kinds: Vec<u32> = done[0].iter().map(|i| i.kind).collect();
            assert_eq!(
                kinds,
                [GEMV, GLU, ADD, GEMV, GEMV, ADD],
                "fold, pair: first chain"
            );
            assert_eq!((done[0][4].norm, done[0][4].mat, done[0][4].w1), (2, 1, wb));
        }
        if fold && !pair {
            // Both norms taken in: no norm instruction, the residual adds after.
            let kinds: Vec<u32> = done[0].iter().map(|i| i.kind).collect();
            assert_eq!(
                kinds,
                [GEMV, GLU, ADD, GEMV, GEMV, GEMV, ADD],
                "fold: first chain"
            );
            assert_eq!((done[0][1].norm, done[0][1].mat), (2, 1));
            assert_eq!((done[0][4].norm, done[0][4].mat, done[0][5].mat), (2, 1, 0));
            assert_eq!(
                done[0][5].reuse, 3,
                "the second in-proj reuses the activation"
            );
        }
        for seed in 0..200u64 {
            let mut got = m.clone();
            let run = |mem: &mut Mem, ins: &[Vec<Ins>]| run_blocks(mem, ins, 5, seed * 7919 + 1);
            run(&mut got, &done[..1]);
            mv(&mut got, wq, xn2, p, h);
            run(&mut got, &done[1..]);
            for (name, s) in [("x", x), ("xn", xn), ("g", g), ("u", u), ("o2", o2)]
                .into_iter()
                .chain([
                    ("xn2", xn2),
                    ("qa", qa),
                    ("qb", qb),
                    ("p", p),
                    ("xf", xf),
                    ("head", head),
                ])
            {
                let n = ((s.1 - s.0) / 4) as usize;
                assert_eq!(
                    got.get(s.0, n),
                    want.get(s.0, n),
                    "fold {fold}, pair {pair}, order {seed}: {name}"
                );
            }
        }
    }
}
