/**
 * One lane's waiting inference passes: a FIFO per organization, served fairly
 * by estimated work (start-time fair queueing).
 *
 *   org A: [a1 a2 a3 … a40]   vtime 812 ─┐   (within one organization: by request admission order)
 *   org B: [b1]                vtime 790 ─┼─► next = the non-empty org with the smallest vtime
 *   org "": [batch CLI]        vtime 805 ─┘     (its vtime then grows by the pass's cost)
 *
 * Each organization has a virtual time: the estimated milliseconds of passes
 * it has been served, counted from when it last became busy. An organization
 * that becomes busy starts at the virtual time of the pass now being served
 * (`vnow`), so idleness earns no credit and a newcomer waits for at most one
 * pass per other busy organization. Between backlogged organizations service
 * is shared equally in estimated work, whatever their pass sizes: 40 queued
 * passes of one organization do not delay another's single one.
 */
export interface FairItem {
  /** Who the pass is for ("" for work without an organization: the CLI, warm-up). */
  org: string;
  /** Estimated ms of the pass. */
  cost: number;
  /**
   * Order within the organization's queue (lower first; equal ranks keep
   * arrival order): the request's admission order, so that the next pass of
   * a request admitted earlier goes before a later request's first pass.
   */
  rank: number;
}

interface OrgQueue<T> {
  items: T[];
  vtime: number;
}

export class FairQueue<T extends FairItem> {
  private readonly orgs = new Map<string, OrgQueue<T>>();
  private vnow = 0;
  private count = 0;

  get length(): number {
    return this.count;
  }

  push(item: T): void {
    let q = this.orgs.get(item.org);
    if (!q) {
      q = { items: [], vtime: this.vnow };
      this.orgs.set(item.org, q);
    }
    if (q.items.length === 0) q.vtime = Math.max(q.vtime, this.vnow);
    let i = q.items.length;
    while (i > 0 && q.items[i - 1]!.rank > item.rank) i--;
    q.items.splice(i, 0, item);
    this.count++;
  }

  /** The next pass to run: the head of the busy organization furthest behind in virtual time. */
  shift(): T | undefined {
    let best: OrgQueue<T> | null = null;
    for (const q of this.orgs.values()) {
      if (q.items.length > 0 && (best === null || q.vtime < best.vtime)) best = q;
    }
    if (!best) return undefined;
    const item = best.items.shift()!;
    this.count--;
    this.vnow = best.vtime;
    best.vtime += Math.max(0, item.cost);
    this.prune();
    return item;
  }

  /**
   * The first waiting pass that `fits`, taking the organizations in order of
   * virtual time and each one's passes in its own order: for the express
   * worker, which serves short passes beside the one running. Charged to its
   * organization's virtual time like any pass; `vnow` stays with the main
   * worker's pass.
   */
  shiftFirst(fits: (item: T) => boolean): T | undefined {
    const order = [...this.orgs.values()].filter((q) => q.items.length > 0).sort((a, b) => a.vtime - b.vtime);
    for (const q of order) {
      const i = q.items.findIndex(fits);
      if (i < 0) continue;
      const [item] = q.items.splice(i, 1);
      this.count--;
      q.vtime += Math.max(0, item!.cost);
      return item;
    }
    return undefined;
  }

  /** Removes a waiting pass (its request was cancelled); false when it is not here. */
  remove(item: T): boolean {
    const q = this.orgs.get(item.org);
    const i = q ? q.items.indexOf(item) : -1;
    if (i < 0) return false;
    q!.items.splice(i, 1);
    this.count--;
    return true;
  }

  /** Every waiting pass, no particular order. */
  *[Symbol.iterator](): IterableIterator<T> {
    for (const q of this.orgs.values()) yield* q.items;
  }

  /** Drops idle organizations that carry no lead over `vnow` (they would restart at `vnow` anyway). */
  private prune(): void {
    for (const [org, q] of this.orgs) if (q.items.length === 0 && q.vtime <= this.vnow) this.orgs.delete(org);
  }
}
