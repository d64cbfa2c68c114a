/**
 * Concurrency slots shared by every replica, in Redis (ASSAY_REDIS_URL).
 *
 * One sorted set per organization, `<prefix>slots:<orgId>`: member = slot id,
 * score = the lease's expiry in ms on the Redis server's clock (TIME, so the
 * replicas' clocks do not matter). Each operation is one Lua script, atomic:
 * acquire drops expired leases, counts the rest and adds one if under the
 * limit. A replica renews its leases every lease/3 while the request runs;
 * a replica that dies stops renewing, and its slots free themselves when
 * their lease runs out. The key itself expires once its newest lease has.
 */
import crypto from "node:crypto";
import os from "node:os";
import { Redis } from "ioredis";
import type { ConcurrencyLimiter, Slot } from "./limiter.js";

const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`;
const KEEP_KEY = `
local lease = tonumber(ARGV[2])
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
`;

/** KEYS[1] set; ARGV: limit, lease ms, slot id → {1, count} admitted, {0, count} full. */
const ACQUIRE = `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[1]) then return {0, n} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
${KEEP_KEY}
return {1, n + 1}
`;

/** KEYS[1] set; ARGV: slot id, lease ms → 1 renewed, 0 lost (expired and taken away). */
const RENEW = `${NOW}
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
${KEEP_KEY}
return 1
`;

/** KEYS[1] set → live leases. */
const COUNT = `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
`;

interface SlotCommands {
  slotAcquire(key: string, limit: number, leaseMs: number, id: string): Promise<[number, number]>;
  slotRenew(key: string, id: string, leaseMs: number): Promise<number>;
  slotCount(key: string): Promise<number>;
}

export interface RedisLimiterOptions {
  url: string;
  /** Key prefix, so several deployments (or test runs) can share one Redis. */
  prefix: string;
  /** How long a slot lives without renewal. Renewed every third of it. */
  leaseMs: number;
  /** Told when a renewal fails or finds the lease gone. */
  onWarning?: (obj: object, msg: string) => void;
  /**
   * How long one command may wait for its reply, ms (default 5000). Redis
   * behind a network partition keeps the connection open and silent; without
   * a bound, admission (and a slot's release) would hang instead of 503.
   */
  commandTimeoutMs?: number;
}

export class RedisLimiter implements ConcurrencyLimiter {
  private readonly redis: Redis & SlotCommands;
  private readonly replica = `${os.hostname()}:${process.pid}`;
  private readonly renewals = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(private readonly options: RedisLimiterOptions) {
    if (!(options.leaseMs >= 300)) throw new Error("slot lease must be at least 300 ms");
    const redis = new Redis(options.url, { maxRetriesPerRequest: 2, lazyConnect: false, commandTimeout: options.commandTimeoutMs ?? 5000 });
    redis.on("error", (err: Error) => options.onWarning?.({ err: err.message }, "redis connection error"));
    redis.defineCommand("slotAcquire", { numberOfKeys: 1, lua: ACQUIRE });
    redis.defineCommand("slotRenew", { numberOfKeys: 1, lua: RENEW });
    redis.defineCommand("slotCount", { numberOfKeys: 1, lua: COUNT });
    this.redis = redis as Redis & SlotCommands;
  }

  key(orgId: string): string {
    return `${this.options.prefix}slots:${orgId}`;
  }

  async acquire(orgId: string, limit: number): Promise<Slot | null> {
    const key = this.key(orgId);
    const id = `${this.replica}:${crypto.randomUUID()}`;
    const [ok] = await this.redis.slotAcquire(key, limit, this.options.leaseMs, id);
    if (ok !== 1) return null;

    const timer = setInterval(() => {
      this.redis.slotRenew(key, id, this.options.leaseMs).then(
        (renewed) => {
          if (renewed !== 1) this.options.onWarning?.({ orgId, slot: id }, "concurrency slot lease was lost before the request ended");
        },
        (err: unknown) => this.options.onWarning?.({ orgId, slot: id, err: String(err) }, "could not renew a concurrency slot lease"),
      );
    }, Math.floor(this.options.leaseMs / 3));
    timer.unref();
    this.renewals.add(timer);

    let released = false;
    return {
      id,
      release: async () => {
        if (released) return;
        released = true;
        clearInterval(timer);
        this.renewals.delete(timer);
        try {
          await this.redis.zrem(key, id);
        } catch (err) {
          // The lease runs out by itself.
          this.options.onWarning?.({ orgId, slot: id, err: String(err) }, "could not release a concurrency slot; its lease will expire");
        }
      },
    };
  }

  async inFlight(orgId: string): Promise<number> {
    return this.redis.slotCount(this.key(orgId));
  }

  /** Stop renewing and disconnect; slots not released expire with their leases. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const t of this.renewals) clearInterval(t);
    this.renewals.clear();
    try {
      await this.redis.quit();
    } catch {
      this.redis.disconnect();
    }
  }
}
