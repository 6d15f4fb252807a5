//! The tree itself: structure, matching, insertion, locks, eviction and the SWA component's
//! rules (`HybridTree` in the parent module is its public face).

use super::*;

impl Tree {
    pub(super) fn new(page: usize, first_id: u64, window: usize, mamba: bool) -> Tree {
        let mut t = Tree {
            page,
            nodes: Vec::new(),
            free: Vec::new(),
            ids: HashMap::new(),
            next_id: first_id,
            clock: 0.0,
            root: NONE,
            evictable: 0,
            protected: 0,
            leaves: HashSet::new(),
            walk: Walk::default(),
            window,
            swa_evictable: 0,
            swa_protected: 0,
            next_uuid: 1,
            lru_head: NONE,
            lru_tail: NONE,
            mamba,
            mamba_evictable: 0,
            mamba_protected: 0,
            mlru_head: NONE,
            mlru_tail: NONE,
            spare: Vec::new(),
        };
        let root = t.alloc(NONE, 0, Vec::new(), Some(Vec::new()));
        t.n_mut(root).full.lock_ref = 1;
        t.root = root;
        t
    }

    pub(super) fn tick(&mut self) -> f64 {
        let t = self.clock;
        self.clock += 1.0;
        t
    }

    pub(super) fn alloc(
        &mut self,
        parent: u32,
        ns: u32,
        key: Vec<i64>,
        value: Option<Vec<i64>>,
    ) -> u32 {
        let last_access = self.tick();
        self.tick(); // SGLang's node also stamps its creation time
        let id = self.next_id;
        self.next_id += 1;
        let node = Node {
            id,
            parent,
            ns,
            key,
            full: Comp { value, lock_ref: 0 },
            swa: Comp::default(),
            swa_uuid: 0,
            lru_prev: NONE,
            lru_next: NONE,
            in_lru: false,
            mamba: Comp::default(),
            mlru_prev: NONE,
            mlru_next: NONE,
            in_mlru: false,
            last_access,
            children: Vec::new(),
            dead: 0,
            pos: 0,
            index: HashMap::new(),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = Some(node);
                s
            }
            None => {
                self.nodes.push(Some(node));
                (self.nodes.len() - 1) as u32
            }
        };
        self.ids.insert(id, slot);
        slot
    }

    pub(super) fn n(&self, s: u32) -> &Node {
        self.nodes[s as usize].as_ref().expect("live slot")
    }

    pub(super) fn n_mut(&mut self, s: u32) -> &mut Node {
        self.nodes[s as usize].as_mut().expect("live slot")
    }

    pub(super) fn slot(&self, id: u64) -> Result<u32> {
        self.ids.get(&id).copied().ok_or(Error::NoNode { node: id })
    }

    /// Node `s`'s live children, in order.
    pub(super) fn kids(&self, s: u32) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.n(s).children.iter().copied().filter(|&c| c != NONE)
    }

    pub(super) fn kid_count(&self, s: u32) -> usize {
        let n = self.n(s);
        n.children.len() - n.dead as usize
    }

    pub(super) fn add_kid(&mut self, parent: u32, child: u32) {
        let pos = self.n(parent).children.len() as u32;
        self.n_mut(parent).children.push(child);
        self.n_mut(child).pos = pos;
    }

    pub(super) fn vlen(&self, s: u32) -> u64 {
        self.n(s).full.value.as_ref().map_or(0, |v| v.len() as u64)
    }

    /// SGLang's D-leaf: not the root, a device value, unlocked, no child with a device value.
    pub(super) fn is_leaf(&self, s: u32) -> bool {
        let n = self.n(s);
        s != self.root
            && n.full.value.is_some()
            && n.full.lock_ref == 0
            && n.swa.lock_ref == 0
            && n.mamba.lock_ref == 0
            && self.kids(s).all(|c| self.n(c).full.value.is_none())
    }

    pub(super) fn refresh_leaf(&mut self, s: u32) {
        if s == NONE {
            return;
        }
        if self.is_leaf(s) {
            self.leaves.insert(s);
        } else {
            self.leaves.remove(&s);
        }
    }

    pub(super) fn child(&self, s: u32, ns: u32, page: &[i64]) -> Option<u32> {
        self.n(s).index.get(&child_key(ns, page)).copied()
    }

    /// The page-rounded common prefix of node `s`'s key and `key`.
    pub(super) fn common(&self, s: u32, key: &[i64]) -> usize {
        let k = &self.n(s).key;
        let n = k.len().min(key.len());
        // Whole 32-token blocks compared as slices (a memcmp), then token by token.
        let mut i = 0;
        while i + 32 <= n && k[i..i + 32] == key[i..i + 32] {
            i += 32;
        }
        while i < n && k[i] == key[i] {
            i += 1;
        }
        i / self.page * self.page
    }

    /// Splits node `s` after `at` tokens: a new node takes the prefix (and `s`'s place under
    /// its parent), `s` keeps its id and the suffix. Returns the new node.
    pub(super) fn split(&mut self, s: u32, at: usize) -> u32 {
        let (parent, ns, prefix, pre_val, lock_ref, pre_swa, swa_lock, uuid) = {
            let n = self.n_mut(s);
            let suffix = n.key.split_off(at);
            let prefix = std::mem::replace(&mut n.key, suffix);
            let pre_val = n.full.value.as_mut().map(|v| {
                let rest = v.split_off(at);
                std::mem::replace(v, rest)
            });
            // SGLang's SWA `redistribute_on_node_split`: the prefix takes its part of the
            // value, the lock ref, and the window boundary stamp (the node's older edge).
            let pre_swa = n.swa.value.as_mut().map(|v| {
                let rest = v.split_off(at);
                std::mem::replace(v, rest)
            });
            let uuid = std::mem::take(&mut n.swa_uuid);
            (n.parent, n.ns, prefix, pre_val, n.full.lock_ref, pre_swa, n.swa.lock_ref, uuid)
        };
        let first = child_key(ns, &prefix[..self.page]);
        let new = self.alloc(parent, ns, prefix, pre_val);
        let page = self.page;
        let suffix_key = child_key(ns, &self.n(s).key[..page]);
        let pos = self.n(s).pos;
        {
            let nn = self.n_mut(new);
            nn.full.lock_ref = lock_ref;
            nn.swa = Comp { value: pre_swa, lock_ref: swa_lock };
            nn.swa_uuid = uuid;
            nn.index.insert(suffix_key, s);
            nn.pos = pos;
        }
        self.add_kid(new, s);
        self.n_mut(s).parent = new;
        {
            let p = self.n_mut(parent);
            p.children[pos as usize] = new;
            p.index.insert(first, new);
        }
        // The prefix's SWA data goes just behind the suffix in the SWA LRU.
        if self.n(new).swa.value.is_some() {
            self.lru_insert_after(s, new);
        }
        let t = self.tick();
        self.n_mut(s).last_access = t;
        self.refresh_leaf(new);
        self.refresh_leaf(s);
        new
    }

    /// The match walk (SGLang's `_match_prefix_helper` for FULL on the device): returns
    /// (matched tokens, deepest node, tokens walked, deepest node walked or NONE).
    pub(super) fn match_walk(&mut self, ns: u32, key: &[i64]) -> (usize, u32, usize, u32) {
        let page = self.page;
        let key = &key[..key.len() / page * page];
        let mut node = self.root;
        let mut off = 0;
        let mut matched = 0;
        let mut best = self.root;
        let mut best_len = 0;
        // SWA's validator (SGLang's `create_match_validator`, gating the prefix match): a
        // node is a valid match end only where the run of SWA-valued nodes back from it
        // covers the window; a tombstone restarts the run. Without SWA every node is valid.
        let window = self.window;
        let mut run = usize::MAX;
        while off < key.len() {
            let Some(c) = self.child(node, ns, &key[off..off + page]) else { break };
            if self.n(c).full.value.is_none() {
                break;
            }
            let p = self.common(c, &key[off..]);
            let split = p < self.n(c).key.len();
            let c = if split { self.split(c, p) } else { c };
            matched += p;
            node = c;
            let swa_ok = window == 0 || {
                if self.n(c).swa.value.is_none() {
                    run = 0;
                    false
                } else {
                    run = run.saturating_add(self.n(c).key.len());
                    run >= window
                }
            };
            // Mamba's validator: a match may end only on a node holding a state.
            let valid = swa_ok && (!self.mamba || self.n(c).mamba.value.is_some());
            if valid {
                best = c;
                best_len = matched;
            }
            if split {
                break;
            }
            off += p;
        }
        if window > 0 {
            self.swa_refresh(best);
        }
        // Mamba's MATCH_END refresh: only the state the match hands out.
        if self.mamba && best != self.root {
            self.mlru_touch(best);
        }
        // Stamp the best node and its ancestors, the deepest newest.
        let mut t = self.tick();
        let mut u = best;
        while u != NONE {
            let n = self.n_mut(u);
            n.last_access = t;
            t -= 0.00001;
            u = n.parent;
        }
        (best_len, best, matched, if node == self.root { NONE } else { node })
    }

    /// SGLang's `match_full_device_prefix`: read-only, no split, no stamp.
    pub(super) fn match_read(&self, ns: u32, key: &[i64]) -> (usize, u32, usize) {
        let page = self.page;
        let key = &key[..key.len() / page * page];
        let mut node = self.root;
        let (mut off, mut pinned) = (0, 0);
        while off < key.len() {
            let Some(c) = self.child(node, ns, &key[off..off + page]) else { break };
            if self.n(c).full.value.is_none() {
                break;
            }
            let p = self.common(c, &key[off..]);
            if p == 0 {
                break;
            }
            off += p;
            node = c;
            pinned += self.n(c).key.len();
            if p < self.n(c).key.len() {
                break;
            }
        }
        (off, node, pinned)
    }

    /// The whole FULL insert (every action FULL emits is deferrable, so SGLang's step-wise
    /// insert runs to completion in one step). Returns (prefix length, target node, the
    /// request's duplicate indices to free).
    pub(super) fn insert(
        &mut self,
        ns: u32,
        key: &[i64],
        value: &[i64],
        prev_prefix_len: usize,
    ) -> (usize, u32, Vec<i64>) {
        let mut acts = Vec::new();
        let (p, node, frees) = self.insert_with(ns, key, value, prev_prefix_len, 0, &mut acts);
        debug_assert!(acts.is_empty());
        (p, node, frees)
    }

    /// The insert with the SWA rules (`swa_start`: the request's SWA-evicted prefix,
    /// page-aligned): SWA's cache actions go to `acts`, in SGLang's order; FULL's duplicate
    /// frees are returned when `acts` gets none of them (always without SWA).
    pub(super) fn insert_with(
        &mut self,
        ns: u32,
        key: &[i64],
        value: &[i64],
        prev_prefix_len: usize,
        swa_start: usize,
        acts: &mut Vec<CacheAction>,
    ) -> (usize, u32, Vec<i64>) {
        let swa = self.window > 0;
        let page = self.page;
        let len = key.len() / page * page;
        let (key, value) = (&key[..len], &value[..len]);
        let root = self.root;
        let t = self.tick();
        self.n_mut(root).last_access = t;
        let mut frees = Vec::new();
        if len == 0 {
            return (0, root, frees);
        }
        let mut node = root;
        let mut total = 0;
        while total < len {
            let Some(mut c) = self.child(node, ns, &key[total..total + page]) else { break };
            let t = self.tick();
            self.n_mut(c).last_access = t;
            let p = self.common(c, &key[total..]);
            if p < self.n(c).key.len() {
                c = self.split(c, p);
            }
            if self.n(c).full.value.is_none() {
                // An evicted node (kept only by a host copy, which this core never makes):
                // restore it from the request's KV.
                let v = value[total..total + p].to_vec();
                let locked = self.n(c).full.lock_ref > 0;
                self.n_mut(c).full.value = Some(v);
                if locked {
                    self.protected += p as u64
                } else {
                    self.evictable += p as u64
                }
                self.refresh_leaf(c);
                let par = self.n(c).parent;
                self.refresh_leaf(par);
            } else if !swa {
                let dup_start = prev_prefix_len.saturating_sub(total);
                if dup_start < p {
                    frees.extend_from_slice(&value[total + dup_start..total + p]);
                }
            } else {
                // SGLang's SWA `update_component_on_insert_overlap`: an SWA tombstone inside
                // the request's live window takes the request's KV back.
                let mut consumed = p;
                if prev_prefix_len < total + p && self.n(c).swa.value.is_none() {
                    let live = total.max(swa_start);
                    if live < total + p {
                        if live > total {
                            self.split(c, live - total);
                        }
                        let incoming = value[live..total + p].to_vec();
                        let old = self.n(c).full.value.clone().unwrap_or_default();
                        if self.n(c).full.lock_ref > 0 {
                            acts.push(CacheAction::RecoverSwaWithLockedFull {
                                node: self.n(c).id,
                                kept: old,
                                incoming,
                            });
                        } else {
                            self.n_mut(c).full.value = Some(incoming.clone());
                            acts.push(CacheAction::FreeDeviceKvFullOnly(old));
                            acts.push(CacheAction::SwaRebuild {
                                node: self.n(c).id,
                                full: incoming,
                            });
                        }
                        consumed = live - total;
                    }
                }
                let dup_start = prev_prefix_len.saturating_sub(total);
                if dup_start < consumed {
                    let dup = &value[total + dup_start..total + consumed];
                    let gone = swa_start.saturating_sub(total + dup_start).min(dup.len());
                    if gone > 0 {
                        acts.push(CacheAction::FreeDeviceKvFullOnly(dup[..gone].to_vec()));
                    }
                    if gone < dup.len() {
                        acts.push(CacheAction::FreeDeviceKv(dup[gone..].to_vec()));
                    }
                }
            }
            node = c;
            total += p;
        }
        let target = if total < len {
            let (k, v) = (self.buf_of(&key[total..]), self.buf_of(&value[total..]));
            let new = self.alloc(node, ns, k, Some(v));
            let k = child_key(ns, &key[total..total + page]);
            self.n_mut(node).index.insert(k, new);
            self.add_kid(node, new);
            self.evictable += (len - total) as u64;
            self.refresh_leaf(new);
            self.refresh_leaf(node);
            if swa {
                self.swa_populate_leaf(new, total, len, swa_start, acts);
            }
            new
        } else {
            node
        };
        (total, target, frees)
    }

    /// SGLang's SWA `commit_insert_component_data` for a new leaf spanning [start, end):
    /// the part past `swa_start` gets SWA values (the cache's `SWARebuild`), the leaf capped
    /// at one page-aligned window (its older part split off as a parent, published first).
    pub(super) fn swa_populate_leaf(
        &mut self,
        leaf: u32,
        start: usize,
        end: usize,
        swa_start: usize,
        acts: &mut Vec<CacheAction>,
    ) {
        let live = start.max(swa_start);
        if live >= end {
            return;
        }
        if live > start {
            self.split(leaf, live - start);
        }
        let tail = self.window.div_ceil(self.page) * self.page;
        let len = self.n(leaf).key.len();
        let mut parent = NONE;
        if self.n(leaf).swa.lock_ref == 0 && len > tail {
            let at = len - tail;
            if self.page == 1 || (at.is_multiple_of(self.page) && len.is_multiple_of(self.page)) {
                parent = self.split(leaf, at);
            }
        }
        for u in [parent, leaf] {
            if u != NONE {
                let v = self.n(u).full.value.clone().unwrap_or_default();
                acts.push(CacheAction::SwaRebuild { node: self.n(u).id, full: v });
            }
        }
    }

    pub(super) fn path_to_root(&self, s: u32) -> Vec<u32> {
        let mut v = Vec::new();
        let mut u = s;
        while u != self.root && u != NONE {
            v.push(u);
            u = self.n(u).parent;
        }
        v
    }

    pub(super) fn lock(&mut self, s: u32) -> u64 {
        let mut delta = 0;
        for u in self.path_to_root(s) {
            let len = self.vlen(u);
            let has = self.n(u).full.value.is_some();
            let n = self.n_mut(u);
            if n.full.lock_ref == 0 && has {
                delta += len;
            }
            n.full.lock_ref += 1;
            self.leaves.remove(&u);
        }
        self.evictable -= delta;
        self.protected += delta;
        delta
    }

    pub(super) fn unlock(&mut self, s: u32) -> Result<u64> {
        let path = self.path_to_root(s);
        if let Some(&u) = path.iter().find(|&&u| self.n(u).full.lock_ref == 0) {
            return Err(Error::InvalidArgument(format!(
                "dec_lock_ref: node {} on the path of node {} has lock_ref 0 (released more \
                 often than locked); nothing was changed",
                self.n(u).id,
                self.n(s).id
            )));
        }
        // A node's lock ref counts the locks through it: its children's plus those taken on
        // it. Releasing one it does not hold itself (an ancestor of a locked node, never
        // locked on its own) would leave it locked less than a child, and the child's own
        // release would then unpin what another request holds.
        if s != self.root {
            let below: u64 = self.kids(s).map(|c| u64::from(self.n(c).full.lock_ref)).sum();
            let own = u64::from(self.n(s).full.lock_ref);
            if own <= below {
                return Err(Error::InvalidArgument(format!(
                    "dec_lock_ref: node {} holds no lock of its own (lock_ref {own}, all of it \
                     its descendants' locks; released more often than locked); nothing was \
                     changed",
                    self.n(s).id
                )));
            }
        }
        let mut delta = 0;
        for u in path {
            let len = self.vlen(u);
            let n = self.n_mut(u);
            if n.full.lock_ref == 1 && n.full.value.is_some() {
                delta += len;
            }
            n.full.lock_ref -= 1;
            if n.full.lock_ref == 0 {
                self.refresh_leaf(u);
            }
        }
        self.evictable += delta;
        self.protected -= delta;
        Ok(delta)
    }

    /// A copy of `src` in a spare buffer that fits (not over 4x its size), else a new one.
    pub(super) fn buf_of(&mut self, src: &[i64]) -> Vec<i64> {
        let n = src.len();
        let fits = |b: &Vec<i64>| b.capacity() >= n && b.capacity() <= 4 * n;
        if let Some(i) = self.spare.iter().position(fits).filter(|_| n >= SPARE_MIN) {
            let mut b = self.spare.swap_remove(i);
            b.clear();
            b.extend_from_slice(src);
            return b;
        }
        src.to_vec()
    }

    pub(super) fn give_back(&mut self, b: Vec<i64>) {
        if b.capacity() >= SPARE_MIN && self.spare.len() < SPARE_MAX {
            self.spare.push(b);
        }
    }

    pub(super) fn remove_leaf(&mut self, s: u32) -> Vec<i64> {
        // Its SWA data goes with it (the caller reads `swa_len` first to free it).
        if self.n(s).swa.value.is_some() {
            self.lru_remove(s);
            let len = self.n(s).swa.value.as_ref().map_or(0, |v| v.len() as u64);
            self.swa_evictable -= len;
        }
        // Its Mamba state too (the caller reads it first to free it).
        if self.n(s).mamba.value.is_some() {
            self.mlru_remove(s);
            self.mamba_evictable -= self.mamba_len(s);
        }
        let n = self.nodes[s as usize].take().expect("live slot");
        self.free.push(s);
        self.ids.remove(&n.id);
        self.leaves.remove(&s);
        let k = child_key(n.ns, &n.key[..self.page]);
        let p = self.n_mut(n.parent);
        p.index.remove(&k);
        let pos = n.pos as usize;
        p.children[pos] = NONE;
        p.dead += 1;
        if p.dead as usize * 2 > p.children.len() {
            p.children.retain(|&c| c != NONE);
            p.dead = 0;
            let kids = p.children.clone();
            for (i, c) in kids.into_iter().enumerate() {
                self.n_mut(c).pos = i as u32;
            }
        }
        let v = n.full.value.unwrap_or_default();
        self.evictable -= v.len() as u64;
        let parent = n.parent;
        self.refresh_leaf(parent);
        self.give_back(n.key);
        v
    }

    pub(super) fn reset(&mut self) {
        let first = self.next_id;
        *self = Tree::new(self.page, first, self.window, self.mamba);
    }

    // ---- SWA (SGLang's `components/swa.py`) ----

    pub(super) fn swa_len(&self, s: u32) -> u64 {
        self.n(s).swa.value.as_ref().map_or(0, |v| v.len() as u64)
    }

    /// Links `s` just after `prev` (toward the LRU end); `prev == NONE`: at the MRU end.
    pub(super) fn lru_insert_after(&mut self, prev: u32, s: u32) {
        debug_assert!(!self.n(s).in_lru);
        let next = if prev == NONE { self.lru_head } else { self.n(prev).lru_next };
        {
            let n = self.n_mut(s);
            n.lru_prev = prev;
            n.lru_next = next;
            n.in_lru = true;
        }
        if prev == NONE {
            self.lru_head = s
        } else {
            self.n_mut(prev).lru_next = s
        }
        if next == NONE { self.lru_tail = s } else { self.n_mut(next).lru_prev = s }
    }

    pub(super) fn lru_remove(&mut self, s: u32) {
        if !self.n(s).in_lru {
            return;
        }
        let (prev, next) = {
            let n = self.n_mut(s);
            n.in_lru = false;
            (std::mem::replace(&mut n.lru_prev, NONE), std::mem::replace(&mut n.lru_next, NONE))
        };
        if prev == NONE {
            self.lru_head = next
        } else {
            self.n_mut(prev).lru_next = next
        }
        if next == NONE { self.lru_tail = prev } else { self.n_mut(next).lru_prev = prev }
    }

    /// SGLang's `reset_node_and_window_ancestors_mru`: `s` and its ancestors within the
    /// window plus one page become the most recent, `s` first, in path order.
    pub(super) fn swa_refresh(&mut self, s: u32) {
        let limit = self.window + self.page;
        let (mut acc, mut prev, mut u) = (0usize, NONE, s);
        while u != self.root && u != NONE && acc < limit {
            if self.n(u).swa.value.is_some() {
                self.lru_remove(u);
                self.lru_insert_after(prev, u);
                prev = u;
            }
            acc += self.n(u).key.len();
            u = self.n(u).parent;
        }
    }

    /// SGLang's SWA `acquire_component_lock`: every node of the segment covering the window
    /// back from `s` (tombstones included) gains a window lock; returns the boundary's
    /// stamp (0: the segment reached the root).
    pub(super) fn swa_lock(&mut self, s: u32) -> u64 {
        let (mut covered, mut uuid, mut u) = (0usize, 0u64, s);
        while u != self.root && covered < self.window {
            let len = self.swa_len(u);
            let n = self.n_mut(u);
            if n.swa.lock_ref == 0 && n.swa.value.is_some() {
                self.swa_evictable -= len;
                self.swa_protected += len;
            }
            let (window, next) = (self.window, self.next_uuid);
            let n = self.n_mut(u);
            n.swa.lock_ref += 1;
            covered += n.key.len();
            if covered >= window {
                if n.swa_uuid == 0 {
                    n.swa_uuid = next;
                    self.next_uuid += 1;
                }
                uuid = self.n(u).swa_uuid;
            }
            self.refresh_leaf(u);
            u = self.n(u).parent;
        }
        uuid
    }

    /// The segment a window lock with stamp `uuid` holds, from `s` (up to the node stamped
    /// `uuid`, or to the root when 0); an error, naming the node, where one is unlocked.
    pub(super) fn swa_segment(&self, s: u32, uuid: u64, what: &str) -> Result<Vec<u32>> {
        let mut seg = Vec::new();
        let mut u = s;
        while u != self.root {
            let n = self.n(u);
            if n.swa.lock_ref == 0 {
                return Err(Error::InvalidArgument(format!(
                    "{what}: node {} in the SWA window segment of node {} has no window lock \
                     (released more often than locked); nothing was changed",
                    n.id,
                    self.n(s).id
                )));
            }
            seg.push(u);
            if uuid != 0 && n.swa_uuid == uuid {
                break;
            }
            u = n.parent;
        }
        Ok(seg)
    }

    /// SGLang's SWA `release_component_lock` (with `early`: `release_window_lock`, where an
    /// SWA value whose last lock goes on a device leaf is evicted at once; its FULL indices
    /// are returned to free). Checked in full before anything changes.
    pub(super) fn swa_unlock(&mut self, s: u32, uuid: u64, early: bool) -> Result<Vec<i64>> {
        let seg =
            self.swa_segment(s, uuid, if early { "dec_swa_lock_only" } else { "dec_lock_ref" })?;
        let mut frees = Vec::new();
        for u in seg {
            let len = self.swa_len(u);
            let n = self.n_mut(u);
            n.swa.lock_ref -= 1;
            let freed = n.swa.lock_ref == 0;
            if freed && n.swa.value.is_some() {
                self.swa_evictable += len;
                self.swa_protected -= len;
            }
            if freed {
                self.refresh_leaf(u);
                if early && self.n(u).swa.value.is_some() && self.is_leaf(u) {
                    frees.extend_from_slice(self.n(u).full.value.as_deref().unwrap_or(&[]));
                    self.swa_tombstone(u);
                }
            }
        }
        Ok(frees)
    }

    /// Drops node `s`'s SWA value (a tombstone: its FULL value stays).
    pub(super) fn swa_tombstone(&mut self, s: u32) -> u64 {
        let len = self.swa_len(s);
        self.lru_remove(s);
        let n = self.n_mut(s);
        n.swa.value = None;
        if n.swa.lock_ref > 0 {
            self.swa_protected -= len
        } else {
            self.swa_evictable -= len
        }
        self.refresh_leaf(s);
        len
    }

    /// SGLang's `set_component_device_value` for SWA: the value becomes the most recent.
    pub(super) fn swa_set(&mut self, s: u32, value: Vec<i64>) -> Result<()> {
        let n = self.n(s);
        if s == self.root || n.swa.value.is_some() || value.len() != n.key.len() {
            return Err(Error::InvalidArgument(format!(
                "set_component_device_value: node {} {}; nothing was changed",
                n.id,
                if s == self.root {
                    "is the root".to_string()
                } else if n.swa.value.is_some() {
                    "already has an SWA value".to_string()
                } else {
                    format!("has {} tokens, the SWA value {}", n.key.len(), value.len())
                }
            )));
        }
        let len = value.len() as u64;
        let locked = n.swa.lock_ref > 0;
        self.n_mut(s).swa.value = Some(value);
        self.lru_insert_after(NONE, s);
        if locked {
            self.swa_protected += len
        } else {
            self.swa_evictable += len
        }
        Ok(())
    }

    /// SGLang's `_walk_span`: `(node, position, matched tokens)` along `key` through `end`,
    /// stopping at a FULL-evicted node or a partial match (after reporting it).
    pub(super) fn walk_span(&self, ns: u32, key: &[i64], end: usize) -> Vec<(u32, usize, usize)> {
        let page = self.page;
        let key = &key[..key.len() / page * page];
        let (mut node, mut pos) = (self.root, 0);
        let mut out = Vec::new();
        while pos < end && pos < key.len() {
            let Some(c) = self.child(node, ns, &key[pos..pos + page]) else { break };
            if self.n(c).full.value.is_none() {
                break;
            }
            let p = self.common(c, &key[pos..]);
            if p == 0 {
                break;
            }
            out.push((c, pos, p));
            if p < self.n(c).key.len() {
                break;
            }
            node = c;
            pos += p;
        }
        out
    }

    /// The least recent unlocked SWA value from `from` (inclusive) toward the MRU end.
    pub(super) fn lru_unlocked_from(&self, mut u: u32) -> u32 {
        while u != NONE && self.n(u).swa.lock_ref > 0 {
            u = self.n(u).lru_prev;
        }
        u
    }
}
