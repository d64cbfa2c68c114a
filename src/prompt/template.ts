import { Template } from "@huggingface/jinja";

/**
 * A build's own chat template (the manifest's `chat_template`, Jinja as
 * transformers runs it), rendered into the two pieces every prompt is cut
 * from: what comes before the user's text and what comes after it.
 */

/** The text around the user's content in a conversation of one system turn and one user turn. */
export interface TurnPieces {
  /** The system turn and the start of the user turn, up to where the user's text begins. */
  open: string;
  /** The end of the user turn and the generation prompt: the answer starts right after it. */
  close: string;
}

/**
 * Stands for the user's text while rendering. Letters and digits only: a
 * template that trims, escapes or title-cases content leaves it as it is.
 */
const SENTINEL = "ASSAYUSERTEXT7f3c91";

/**
 * The date a date-dependent template writes (Llama 3.1's "Today Date"): a
 * prompt that changed with the clock would change its readings, its
 * calibration and every prefix-cache key at midnight.
 */
export const PINNED_DATE = "26 Jul 2024";

/** The name the pinned `strftime_now` is passed under (see `compile`). */
const PINNED_STRFTIME = "assay_pinned_strftime_now";

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const PINNED = new Date(Date.UTC(2024, 6, 26));

/** Python's `strftime` on the pinned date (UTC midnight, English names); unknown directives are left as written. */
export function pinnedStrftime(format: string): string {
  const two = (n: number) => String(n).padStart(2, "0");
  const d = PINNED;
  const year = d.getUTCFullYear();
  const month = d.getUTCMonth();
  const day = d.getUTCDate();
  const yday = Math.round((d.getTime() - Date.UTC(year, 0, 1)) / 86_400_000) + 1;
  const fields: Record<string, string> = {
    Y: String(year),
    y: two(year % 100),
    m: two(month + 1),
    "-m": String(month + 1),
    d: two(day),
    "-d": String(day),
    e: String(day).padStart(2, " "),
    b: MONTHS[month]!.slice(0, 3),
    h: MONTHS[month]!.slice(0, 3),
    B: MONTHS[month]!,
    a: DAYS[d.getUTCDay()]!.slice(0, 3),
    A: DAYS[d.getUTCDay()]!,
    j: String(yday).padStart(3, "0"),
    H: "00",
    I: "12",
    M: "00",
    S: "00",
    p: "AM",
    "%": "%",
  };
  return format.replace(/%(-?[a-zA-Z%])/g, (whole, f: string) => fields[f] ?? whole);
}

export class ChatTemplate {
  private readonly template: Template;
  private readonly tokens: Record<string, string>;
  private readonly cache = new Map<string, TurnPieces>();
  /**
   * The template refuses a system turn (Gemma 2 raises "System role not
   * supported") or drops its text: the system text then opens the user's turn.
   */
  readonly foldsSystem: boolean;
  /** What closes every user turn, whatever the system text (checked at compile). */
  readonly close: string;

  private constructor(template: Template, tokens: Record<string, string>, foldsSystem: boolean, close: string) {
    this.template = template;
    this.tokens = tokens;
    this.foldsSystem = foldsSystem;
    this.close = close;
  }

  /**
   * The template compiled and probed with `systems` (two different texts at
   * least), or null where it cannot serve a prompt: it does not parse or
   * render, it loses the user's text, or it marks no end of the user turn
   * and no generation prompt (then nothing tells where the answer starts).
   * `special` is the manifest's special_tokens (bos, eos, pad), passed as
   * `bos_token`, `eos_token`, `pad_token`.
   */
  static compile(source: string, special: Record<string, string>, systems: readonly string[]): ChatTemplate | null {
    let template: Template;
    try {
      template = new Template(source);
      // The renderer declares its own `strftime_now` (the clock) and refuses
      // a second declaration of it: the pinned one is assigned over it by a
      // statement put before the template's first.
      template.parsed.body.unshift(...new Template(`{% set strftime_now = ${PINNED_STRFTIME} %}`).parsed.body);
    } catch {
      return null;
    }
    const tokens = Object.fromEntries(Object.entries(special).map(([k, v]) => [`${k}_token`, v]));
    const probe = systems[0] ?? "";
    const direct = tryRender(template, tokens, probe, false);
    const foldsSystem = direct === null || !direct.open.includes(probe);
    const pieces = systems.map((s) => tryRender(template, tokens, s, foldsSystem));
    const first = pieces[0];
    if (!first || pieces.some((p) => p === null || p.close !== first.close)) return null;
    if (first.close.trim().length === 0) return null;
    const chat = new ChatTemplate(template, tokens, foldsSystem, first.close);
    systems.forEach((s, i) => chat.cache.set(s, pieces[i]!));
    return chat;
  }

  /** The pieces around the user's text under this system text, rendered once per text. */
  pieces(system: string): TurnPieces {
    const known = this.cache.get(system);
    if (known) return known;
    const p = tryRender(this.template, this.tokens, system, this.foldsSystem);
    // The probes at compile rendered; a system text that still breaks the
    // template has no rendering to fall back on.
    if (!p) throw new Error("the chat template does not render this system text");
    this.cache.set(system, p);
    return p;
  }
}

function tryRender(template: Template, tokens: Record<string, string>, system: string, fold: boolean): TurnPieces | null {
  const messages = fold
    ? [{ role: "user", content: `${system}\n\n${SENTINEL}` }]
    : [
        { role: "system", content: system },
        { role: "user", content: SENTINEL },
      ];
  let text: string;
  try {
    text = template.render({
      ...tokens,
      messages,
      add_generation_prompt: true,
      // Qwen3 then closes an empty think block in the generation prompt: the
      // answer is read as the first token after it, not after a reasoning trace.
      enable_thinking: false,
      date_string: PINNED_DATE,
      [PINNED_STRFTIME]: pinnedStrftime,
    });
  } catch {
    return null;
  }
  const at = text.indexOf(SENTINEL);
  if (at < 0 || text.indexOf(SENTINEL, at + 1) >= 0) return null;
  return { open: text.slice(0, at), close: text.slice(at + SENTINEL.length) };
}
