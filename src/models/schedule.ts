/**
 * When a scheduled model build is kept loaded. Pure: parsing and a clock
 * check, with the zone's wall-clock time read through Intl (no tz library).
 *
 * Grammar: `always` | `never` | `<days> <HH:MM>-<HH:MM> <IANA zone>`, where
 * days is `mon-fri`, `sat,sun`, `mon-wed,fri`, or `daily`. The end time is
 * exclusive; a window that ends before it starts runs past midnight.
 */
export type Schedule =
  | { kind: "always" }
  | { kind: "never" }
  | { kind: "window"; days: ReadonlySet<number>; fromMin: number; toMin: number; zone: string; text: string };

const DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"] as const;

function dayIndex(d: string, text: string): number {
  const i = DAYS.indexOf(d.toLowerCase() as (typeof DAYS)[number]);
  if (i < 0) throw new Error(`schedule "${text}": unknown day "${d}" (use ${DAYS.join(", ")})`);
  return i;
}

function minutes(hhmm: string, text: string): number {
  const m = /^(\d{1,2}):(\d{2})$/.exec(hhmm);
  if (!m || Number(m[1]) > 24 || Number(m[2]) > 59) throw new Error(`schedule "${text}": bad time "${hhmm}" (use HH:MM)`);
  return Number(m[1]) * 60 + Number(m[2]);
}

export function parseSchedule(text: string): Schedule {
  const t = text.trim();
  if (t === "always") return { kind: "always" };
  if (t === "never") return { kind: "never" };
  const parts = t.split(/\s+/);
  if (parts.length !== 3) {
    throw new Error(`schedule "${text}": expected "always", "never" or "<days> HH:MM-HH:MM <zone>"`);
  }
  const [daysText, range, zone] = parts as [string, string, string];
  const days = new Set<number>();
  if (daysText === "daily") for (let i = 0; i < 7; i++) days.add(i);
  else {
    for (const piece of daysText.split(",")) {
      const [a, b] = piece.split("-");
      const from = dayIndex(a!, text);
      const to = b === undefined ? from : dayIndex(b, text);
      for (let i = from; ; i = (i + 1) % 7) {
        days.add(i);
        if (i === to) break;
      }
    }
  }
  const [f, e] = range.split("-");
  if (f === undefined || e === undefined) throw new Error(`schedule "${text}": bad range "${range}" (use HH:MM-HH:MM)`);
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: zone });
  } catch {
    throw new Error(`schedule "${text}": unknown time zone "${zone}"`);
  }
  return { kind: "window", days, fromMin: minutes(f, text), toMin: minutes(e, text), zone, text: t };
}

/** Weekday (0 = Sunday) and minute of the day at `at` in `zone`. */
function wallClock(at: Date, zone: string): { day: number; minute: number } {
  const parts = new Intl.DateTimeFormat("en-US", {
    timeZone: zone,
    weekday: "short",
    hour: "2-digit",
    minute: "2-digit",
    hourCycle: "h23",
  }).formatToParts(at);
  const get = (t: string) => parts.find((p) => p.type === t)?.value ?? "";
  return { day: dayIndex(get("weekday").slice(0, 3), zone), minute: Number(get("hour")) * 60 + Number(get("minute")) };
}

export function inSchedule(s: Schedule, at: Date = new Date()): boolean {
  if (s.kind === "always") return true;
  if (s.kind === "never") return false;
  const { day, minute } = wallClock(at, s.zone);
  if (s.fromMin <= s.toMin) return s.days.has(day) && minute >= s.fromMin && minute < s.toMin;
  // Past midnight: the evening part belongs to `day`, the morning part to the day before.
  if (minute >= s.fromMin) return s.days.has(day);
  return minute < s.toMin && s.days.has((day + 6) % 7);
}
