"""A host model of topk_select_per_cta.patch's two rounds, thread by thread as the kernel lays them out
(512 threads a CTA, PER_THREAD consecutive positions a thread, GROUP-lane groups of the bound, 8-bit radix
passes, the take's slots, the lists' offsets), against a sorted reference (key descending, id ascending) on
random, tied, logit-like and +-0 scores. It checks the selection logic, not the CUDA: the kernel's GPU
tests do that. Usage: python3 topk_select_per_cta_model.py [SEED]"""
import random, struct, math, sys
T = 512
def ceil_div(a, b): return (a + b - 1) // b
def order_key(v):
    if v == 0.0: u = 0
    else: u = struct.unpack('<I', struct.pack('<f', v))[0]
    return (~u) & 0xffffffff if (u & 0x80000000) else (u | 0x80000000)
def group(positions, pt, need):
    lanes = 32
    while lanes >= 1:
        if ceil_div(positions, pt * lanes) >= need: return lanes
        lanes //= 2
    return 0
def keys_of(vocab, chunk, c): return max(0, min(chunk, vocab - c * chunk))
def kept(vocab, chunk, k, c): return min(k, keys_of(vocab, chunk, c))
def offset(vocab, chunk, k, c): return sum(kept(vocab, chunk, k, i) for i in range(c))
def fewest(vocab, chunk, k, split):
    f = chunk
    for c in range(split):
        if keys_of(vocab, chunk, c) > k: f = min(f, keys_of(vocab, chunk, c))
    return f
def clz(x): return 32 - x.bit_length()

def cta_select(thread_keys, pt, grp, need_k):
    # thread_keys: list of T lists (valid keys, in position order)
    t_hi = [max(k) if k else 0 for k in thread_keys]
    t_lo = [min(k) if k else 0xffffffff for k in thread_keys]
    if grp > 0:
        g = []
        for t in range(T):
            base = t - t % grp
            m = max(t_hi[base:base + grp])
            g.append(0xffffffff if m == 0 else m)
    else:
        g = t_lo
    lo = min(g); hi = max(t_hi)
    diff = lo ^ hi
    shift = 0 if diff == 0 else max(31 - clz(diff) - 7, 0)
    mask = 0 if shift + 8 >= 32 else (0xffffffff << (shift + 8)) & 0xffffffff
    prefix = lo & mask
    need = need_k
    while True:
        hist = [0] * 256
        for ks in thread_keys:
            for k in ks:
                if k >= lo and (k & mask) == prefix: hist[(k >> shift) & 255] += 1
        # from highest digit down
        before = 0; found = None
        for d in range(255, -1, -1):
            if before + hist[d] >= need:
                found = (d, need - before, hist[d]); break
            before += hist[d]
        assert found is not None, "no digit"
        prefix = (prefix & ~(255 << shift) & 0xffffffff) | (found[0] << shift)
        mask |= (255 << shift) & 0xffffffff
        need = found[1]
        if found[2] == need or shift == 0: break
        shift = max(shift - 8, 0)
    # take in position order
    taken = []
    gt_b = 0; eq_b = 0
    for t, ks in enumerate(thread_keys):
        for j, k in enumerate(ks):
            if k >= lo:
                km = k & mask
                if km > prefix: taken.append((gt_b + min(eq_b, need), t, j)); gt_b += 1
                elif km == prefix and eq_b < need: taken.append((gt_b + eq_b, t, j)); eq_b += 1
    assert len(taken) == need_k, (len(taken), need_k)
    assert sorted(s for s, _, _ in taken) == list(range(need_k))
    return taken

def topk(scores, vocab, K, split):
    pt = ceil_div(vocab, split * T); chunk = pt * T
    grp = group(fewest(vocab, chunk, K, split), pt, K)
    lists = []
    for c in range(split):
        tk = []
        for t in range(T):
            first = c * chunk + t * pt
            n = max(0, min(pt, vocab - first))
            tk.append([order_key(scores[first + j]) for j in range(n)])
        lst = [None] * kept(vocab, chunk, K, c)
        if keys_of(vocab, chunk, c) > K:
            for slot, t, j in cta_select(tk, pt, grp, K):
                lst[slot] = (tk[t][j], c * chunk + t * pt + j)
        else:
            for t in range(T):
                for j, k in enumerate(tk[t]): lst[t * pt + j] = (k, c * chunk + t * pt + j)
        assert all(x is not None for x in lst)
        lists.append(lst)
    if split == 1:
        return sorted(i for _, i in lists[0])  # ids in slot order are ascending already
    cand = offset(vocab, chunk, K, split)
    ptm = ceil_div(cand, T)
    gm = group(cand, ptm, K)
    merged = []
    for m in range(cand):
        c = 0
        for cc in range(1, split):
            if m >= offset(vocab, chunk, K, cc): c = cc
        merged.append(lists[c][m - offset(vocab, chunk, K, c)])
    ids = [i for _, i in merged]
    assert ids == sorted(ids)
    if cand == K: return ids
    tk = [[merged[m][0] for m in range(t * ptm, min(cand, t * ptm + ptm))] for t in range(T)]
    out = [None] * K
    for slot, t, j in cta_select(tk, ptm, gm, K):
        out[slot] = merged[t * ptm + j][1]
    assert out == sorted(out)
    return out

def reference(scores, K):
    order = sorted(range(len(scores)), key=lambda i: (-order_key(scores[i]), i))
    return sorted(order[:K])

random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
cases = [(32000, 64, 8), (32000, 512, 8), (65536, 512, 8), (5001, 300, 2), (1000, 300, 8), (300, 16, 1),
         (5000, 1, 2), (40000, 64, 1), (4097, 64, 2), (8192, 4096, 2), (33, 33, 8), (1000, 999, 8)]
for vocab, K, split in cases:
    for pattern in ["random", "ties", "logits", "zeros"]:
        if pattern == "random": s = [random.uniform(-10, 10) for _ in range(vocab)]
        elif pattern == "ties": s = [float(random.randint(0, 5)) for _ in range(vocab)]
        elif pattern == "logits": s = [random.gauss(0, 3) for _ in range(vocab)]
        else: s = [random.choice([0.0, -0.0, 1.0, -1.0]) for _ in range(vocab)]
        s = [struct.unpack('<f', struct.pack('<f', x))[0] for x in s]
        got = topk(s, vocab, K, split)
        want = reference(s, K)
        assert got == want, (vocab, K, split, pattern)
    print("ok", vocab, K, split)
