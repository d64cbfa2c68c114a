/**
 * The sanity suite's cases (issue 18, item 4): short questions a user would
 * ask first, each written for this suite (none taken from a data set), each
 * unambiguous to a human reader, each answerable from the state alone (no
 * world knowledge, no arithmetic, no sarcasm). Cases that share a state are
 * asked in one request.
 *
 * Balance: the `noul` cases are about half expected-true and half
 * expected-false, the expected choice keys and score ends vary, so a model
 * with a constant lean cannot pass.
 */
import type { Question, State } from "../../src/validate/schema.js";

export type Expectation =
  /** `noul` above 0.5 (true) or below 0.5 (false). */
  | { type: "noul"; truth: boolean }
  /** `choice` equals this key. */
  | { type: "choice"; key: string }
  /**
   * `score` on this end of the scale: with k levels and middle m = (k − 1) / 2,
   * "low" is `score` < m and the most probable level < m; "high" is both > m.
   */
  | { type: "score"; end: "low" | "high" };

export interface SanityCase {
  /** Unique across the suite: `category/what`. */
  name: string;
  question: Question;
  expect: Expectation;
}

export interface SanityRequest {
  state: State;
  cases: SanityCase[];
}

const truth = (name: string, instructions: string): SanityCase => ({
  name,
  question: { type: "noul", instructions },
  expect: { type: "noul", truth: true },
});
const falsity = (name: string, instructions: string): SanityCase => ({
  name,
  question: { type: "noul", instructions },
  expect: { type: "noul", truth: false },
});
const choose = (name: string, instructions: string, criteria: Record<string, string | null>, key: string): SanityCase => ({
  name,
  question: { type: "choice", instructions, criteria },
  expect: { type: "choice", key },
});
const low = (name: string, instructions: string, criteria: string[]): SanityCase => ({
  name,
  question: { type: "score", instructions, criteria },
  expect: { type: "score", end: "low" },
});
const high = (name: string, instructions: string, criteria: string[]): SanityCase => ({
  name,
  question: { type: "score", instructions, criteria },
  expect: { type: "score", end: "high" },
});

// ---- option sets and scales ------------------------------------------------

const TOPICS = { sports: null, politics: null, technology: null, cooking: null };
const TOPICS_DESCRIBED = {
  cooking: "recipes, food and preparing meals",
  technology: "computers, phones, software and gadgets",
  sports: "games, athletes, matches and competitions",
  politics: "government, elections, parties and laws",
};
const TOPICS_SIX = { sports: null, politics: null, technology: null, cooking: null, music: null, travel: null };
const SUPPORT_INTENTS = { refund_request: null, delivery_status: null, password_reset: null, change_address: null };
const BANK_INTENTS = {
  card_lost: "the customer lost their bank card or it was stolen",
  balance_inquiry: "the customer asks how much money is in their account",
  transfer_failed: "a money transfer the customer made did not go through",
};
const LETTERED_NEEDS = {
  A: "a refund of the money paid",
  B: "information about when the order will arrive",
  C: "help with logging in to the account",
};
const MESSAGE_KINDS = {
  complaint: "the writer is unhappy about something and complains",
  praise: "the writer compliments or thanks someone",
  question: "the writer asks for a piece of information",
};

const SENTIMENT = ["very negative", "negative", "neutral", "positive", "very positive"];
const STARS = ["1", "2", "3", "4", "5"];
const ZERO_TO_TEN = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
const ONE_TO_TEN = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
const URGENCY = ["not urgent at all", "slightly urgent", "moderately urgent", "very urgent", "extremely urgent"];
const ANGER = ["calm", "slightly annoyed", "annoyed", "angry", "furious"];
const POLITENESS = ["very rude", "rude", "neutral", "polite", "very polite"];
const DANGER = ["safe", "somewhat dangerous", "very dangerous"];
const LIKELIHOOD = ["very unlikely", "unlikely", "unsure", "likely", "very likely"];
const WARMTH = ["freezing", "cold", "mild", "warm", "hot"];
const HEAT = ["very cold", "cold", "mild", "warm", "very hot"];

const NO_REFUND = 'The customer writes: "Thanks, everything arrived fine, I do not want any refund."';
const WANTS_REFUND = 'The customer writes: "The blender arrived broken. I want a refund, please send my money back."';

export const SANITY_REQUESTS: SanityRequest[] = [
  // ---- negations -------------------------------------------------------------
  {
    state: "The package did not arrive.",
    cases: [
      falsity("negation/package-arrived", "The package arrived."),
      truth("negation/package-did-not-arrive", "The package did not arrive."),
      falsity("question/package-delivered", "Was the package delivered?"),
    ],
  },
  {
    state: "Maria is not coming to the party tonight.",
    cases: [
      falsity("negation/maria-coming", "Maria is coming to the party tonight."),
      truth("negation/maria-not-there", "Maria will not be at the party tonight."),
    ],
  },
  {
    state: "The store is closed on Sundays.",
    cases: [
      falsity("negation/store-open-sunday", "The store is open on Sundays."),
      truth("question/store-closed-sunday", "Is the store closed on Sundays?"),
    ],
  },
  {
    state: "The printer is not broken; it works fine.",
    cases: [
      truth("negation/printer-works", "The printer works."),
      falsity("negation/printer-broken", "The printer is broken."),
    ],
  },
  {
    state: "The front door was not locked last night.",
    cases: [
      falsity("negation/door-locked", "The front door was locked last night."),
      truth("negation/door-left-unlocked", "The front door was left unlocked last night."),
    ],
  },
  {
    state: "I did not lose my keys; they were in my coat pocket all along.",
    cases: [
      falsity("negation/keys-lost", "The writer lost their keys."),
      truth("question/keys-in-pocket", "Were the keys in the coat pocket?"),
    ],
  },

  // ---- explicit yes / no -----------------------------------------------------
  {
    state: "Yes, I will attend the meeting on Monday.",
    cases: [
      truth("explicit/will-attend", "The writer will attend the meeting on Monday."),
      falsity("explicit/will-skip", "Is the writer going to skip the meeting?"),
    ],
  },
  {
    state: "No, we do not ship to Canada.",
    cases: [
      falsity("explicit/ships-to-canada", "The company ships to Canada."),
      truth("explicit/does-not-ship-to-canada", "The company does not ship to Canada."),
    ],
  },
  {
    state: "Question: Is the shop open today? Answer: No, the shop is closed today.",
    cases: [falsity("explicit/shop-open", "The shop is open today.")],
  },
  {
    state: "Question: Did the payment go through? Answer: Yes.",
    cases: [truth("explicit/payment-went-through", "The payment went through.")],
  },

  // ---- the refund example (issue 18), as a question and as a statement -------
  {
    state: NO_REFUND,
    cases: [
      falsity("refund/no-refund-question", "Is the customer asking for a refund?"),
      falsity("refund/no-refund-statement", "The customer asks for a refund."),
      truth("refund/no-refund-satisfied", "Is the customer satisfied with the delivery?"),
    ],
  },
  {
    state: WANTS_REFUND,
    cases: [
      truth("refund/wants-refund-question", "Is the customer asking for a refund?"),
      truth("refund/wants-refund-statement", "The customer asks for a refund."),
      falsity("refund/wants-refund-happy", "Is the customer happy with the blender?"),
    ],
  },

  // ---- questions phrased as questions and as statements ----------------------
  {
    state: "The flight to Paris was cancelled because of the storm.",
    cases: [
      truth("question/flight-cancelled", "Was the flight cancelled?"),
      falsity("question/flight-on-time", "Did the flight leave on time?"),
    ],
  },
  {
    state: "Lisa bought three apples and a loaf of bread.",
    cases: [truth("question/lisa-bread", "Did Lisa buy bread?"), falsity("question/lisa-milk", "Did Lisa buy milk?")],
  },
  {
    state: "My laptop screen is cracked and the laptop will not turn on.",
    cases: [
      falsity("question/laptop-working", "Is the laptop working?"),
      truth("question/laptop-screen-damaged", "Is the laptop screen damaged?"),
    ],
  },
  {
    state: "It is raining heavily outside.",
    cases: [
      truth("statement/raining", "It is raining."),
      falsity("statement/sunny-and-dry", "The weather is sunny and dry."),
    ],
  },
  {
    state: "The dog is sleeping on the sofa.",
    cases: [
      truth("statement/dog-on-sofa", "The dog is on the sofa."),
      falsity("statement/dog-in-park", "The dog is running in the park."),
    ],
  },
  {
    state: "Hi, click the link below to reset your password. The link expires in 24 hours.",
    cases: [
      truth("question/password-reset-message", "Is this message about resetting a password?"),
      falsity("question/dinner-reservation-message", "Is this message about a dinner reservation?"),
    ],
  },
  {
    state: 'The customer writes: "I want to cancel my subscription today."',
    cases: [
      truth("question/wants-to-cancel", "Does the customer want to cancel the subscription?"),
      falsity("statement/wants-upgrade", "The customer wants to upgrade to a bigger plan."),
    ],
  },

  // ---- JSON states -----------------------------------------------------------
  {
    state: { order_id: 4411, customer: "J. Park", status: "refunded", amount: 39.99, currency: "EUR" },
    cases: [
      truth("json/order-refunded", "The order was refunded."),
      truth("json/order-refunded-question", "Has this order been refunded?"),
      falsity("json/order-in-dollars", "The amount is in US dollars."),
      choose("json/order-status", "What is the status of the order?", { pending: null, shipped: null, delivered: null, refunded: null }, "refunded"),
    ],
  },
  {
    state: { name: "Ana", newsletter_opt_in: false, account_active: true, plan: "premium" },
    cases: [
      falsity("json/newsletter-opt-in", "Ana has opted in to the newsletter."),
      truth("json/account-active", "Ana's account is active."),
      choose("json/plan", "Which plan is Ana on?", { free: null, basic: null, premium: null }, "premium"),
    ],
  },
  {
    state: [
      { task: "Write the report", done: true },
      { task: "Call the supplier", done: false },
    ],
    cases: [
      truth("json/task-report-done", "The task 'Write the report' is done."),
      falsity("json/task-supplier-done", "The task 'Call the supplier' is done."),
    ],
  },
  {
    state: { station: "North Ridge", unit: "celsius", readings: [-12, -15, -9, -14], note: "snow and ice all day" },
    cases: [
      truth("json/readings-below-zero", "All the readings are below zero."),
      falsity("json/hot-summer-day", "It is a hot summer day at the station."),
      low("json/station-warmth", "How warm is it at the station?", WARMTH),
    ],
  },
  {
    state: {
      city: "Dunmore",
      warning: "extreme heat",
      forecast: [
        { day: "Monday", high_c: 41, sky: "sunny" },
        { day: "Tuesday", high_c: 43, sky: "sunny" },
        { day: "Wednesday", high_c: 40, sky: "sunny" },
      ],
    },
    cases: [
      falsity("json/rain-on-tuesday", "Rain is forecast for Tuesday."),
      high("json/forecast-heat", "How hot is the weather in the forecast?", HEAT),
    ],
  },
  {
    state: { product: "headphones", review: "Loved them, crystal clear sound, would buy again!", verified_buyer: true },
    cases: [high("json/review-sentiment", "How positive is this review?", SENTIMENT)],
  },

  // ---- topics: null descriptions ---------------------------------------------
  {
    state: "The striker scored twice in the last ten minutes and the team won the cup.",
    cases: [choose("topic/football-final", "What is the text about?", TOPICS, "sports")],
  },
  {
    state: "Parliament voted on the new tax law after a long debate between the parties.",
    cases: [choose("topic/tax-law-vote", "What is the text about?", TOPICS, "politics")],
  },
  {
    state: "The new phone has a faster chip, more memory and a better camera sensor.",
    cases: [choose("topic/new-phone", "What is the text about?", TOPICS, "technology")],
  },
  {
    state: "Chop the onions, fry them in butter, then add the rice and stir for two minutes.",
    cases: [choose("topic/fry-onions", "What is the text about?", TOPICS, "cooking")],
  },

  // ---- topics: options with descriptions -------------------------------------
  {
    state: "The senator announced that she will run for president in the next election.",
    cases: [choose("topic-described/senator", "Which topic does the text belong to?", TOPICS_DESCRIBED, "politics")],
  },
  {
    state: "Bake the cake at 180 degrees for forty minutes, then let it cool before adding the icing.",
    cases: [choose("topic-described/bake-cake", "Which topic does the text belong to?", TOPICS_DESCRIBED, "cooking")],
  },
  {
    state: "She won the tennis match in three sets and will play the final on Sunday.",
    cases: [choose("topic-described/tennis-match", "Which topic does the text belong to?", TOPICS_DESCRIBED, "sports")],
  },
  {
    state: "The latest software update fixes a bug that made the laptop's keyboard stop responding.",
    cases: [choose("topic-described/software-update", "Which topic does the text belong to?", TOPICS_DESCRIBED, "technology")],
  },

  // ---- topics: six options ---------------------------------------------------
  {
    state: "The band played their new album live and the whole crowd sang along to every song.",
    cases: [choose("topic-six/concert", "What is the text about?", TOPICS_SIX, "music")],
  },
  {
    state: "We flew to Lisbon, stayed in a small hotel and spent a week exploring the old town.",
    cases: [choose("topic-six/trip-to-lisbon", "What is the text about?", TOPICS_SIX, "travel")],
  },

  // ---- snake_case keys, null descriptions ------------------------------------
  {
    state: "I forgot my password and now I cannot log in.",
    cases: [choose("intent/forgot-password", "What does the customer want?", SUPPORT_INTENTS, "password_reset")],
  },
  {
    state: "Where is my parcel? It was supposed to arrive yesterday and the tracking page shows nothing.",
    cases: [choose("intent/where-is-parcel", "What does the customer want?", SUPPORT_INTENTS, "delivery_status")],
  },
  {
    state: "I moved to a new home last week. Please send all my future orders to 12 Elm Street instead.",
    cases: [choose("intent/new-address", "What does the customer want?", SUPPORT_INTENTS, "change_address")],
  },
  {
    state: "The shoes do not fit and I already sent them back. I want my money returned.",
    cases: [choose("intent/money-back", "What does the customer want?", SUPPORT_INTENTS, "refund_request")],
  },

  // ---- snake_case keys with descriptions -------------------------------------
  {
    state: "I cannot find my debit card anywhere. I think I dropped it on the bus.",
    cases: [choose("bank/card-dropped", "What is the customer's issue?", BANK_INTENTS, "card_lost")],
  },
  {
    state: "How much money do I have in my checking account right now?",
    cases: [choose("bank/how-much-money", "What is the customer's issue?", BANK_INTENTS, "balance_inquiry")],
  },
  {
    state: "I sent 200 euros to my sister yesterday, but the transfer was rejected and she got nothing.",
    cases: [choose("bank/transfer-rejected", "What is the customer's issue?", BANK_INTENTS, "transfer_failed")],
  },

  // ---- letter keys carrying descriptions -------------------------------------
  {
    state: "When will my order arrive? I ordered it five days ago.",
    cases: [choose("described/when-will-it-arrive", "What does the customer need?", LETTERED_NEEDS, "B")],
  },
  {
    state: "I cannot log in to my account: the site keeps saying my password is wrong.",
    cases: [choose("described/cannot-log-in", "What does the customer need?", LETTERED_NEEDS, "C")],
  },
  {
    state: "I paid twice for the same order. Please return the extra payment to my card.",
    cases: [choose("described/paid-twice", "What does the customer need?", LETTERED_NEEDS, "A")],
  },

  // ---- message kinds, with descriptions --------------------------------------
  {
    state: "Your support agent Maya was wonderful. Thank you so much for the quick help!",
    cases: [choose("kind/thanks-to-maya", "What kind of message is this?", MESSAGE_KINDS, "praise")],
  },
  {
    state: "What time does your store open on Saturdays?",
    cases: [choose("kind/opening-hours", "What kind of message is this?", MESSAGE_KINDS, "question")],
  },
  {
    state: "I was charged twice and nobody answers my emails. This is unacceptable.",
    cases: [choose("kind/charged-twice", "What kind of message is this?", MESSAGE_KINDS, "complaint")],
  },

  // ---- extraction choices ----------------------------------------------------
  {
    state: "Anna's umbrella is yellow.",
    cases: [choose("extract/umbrella-color", "What color is Anna's umbrella?", { red: null, yellow: null, blue: null }, "yellow")],
  },
  {
    state: "The dentist appointment is on Thursday at 3 pm.",
    cases: [
      choose(
        "extract/appointment-day",
        "On which day is the appointment?",
        { monday: null, tuesday: null, wednesday: null, thursday: null, friday: null },
        "thursday",
      ),
    ],
  },
  {
    state: "This morning I rode my bicycle to work along the river.",
    cases: [choose("extract/transport", "How did the writer get to work?", { car: null, bus: null, bicycle: null, train: null }, "bicycle")],
  },
  {
    state: "This is the worst hotel I have ever stayed in: dirty rooms and rude staff.",
    cases: [choose("extract/hotel-sentiment", "Is the review positive or negative?", { positive: null, negative: null }, "negative")],
  },

  // ---- sentiment: five named levels ------------------------------------------
  {
    state: "A masterpiece: the best film of the year, I loved every minute.",
    cases: [high("sentiment/masterpiece", "How positive is this review?", SENTIMENT)],
  },
  {
    state: "Terrible. The product broke after one day and support ignored me. Avoid.",
    cases: [low("sentiment/broke-after-one-day", "How positive is this review?", SENTIMENT)],
  },
  {
    state: "The staff were rude, the food was cold and we waited an hour. Never again.",
    cases: [low("sentiment/cold-food", "How positive is this review?", SENTIMENT)],
  },
  {
    state: "Absolutely delighted with my new bike, it rides beautifully!",
    cases: [high("sentiment/new-bike", "How positive is this review?", SENTIMENT)],
  },

  // ---- numbered scales -------------------------------------------------------
  {
    state: "Excellent quality and fast delivery. I am very happy with it.",
    cases: [high("stars/excellent-quality", "How many stars (1 = worst, 5 = best) would the reviewer give?", STARS)],
  },
  {
    state: "Awful. The item was broken and the seller never replied.",
    cases: [low("stars/broken-item", "How many stars (1 = worst, 5 = best) would the reviewer give?", STARS)],
  },
  {
    state: "I am extremely satisfied: everything was perfect, thank you!",
    cases: [high("zero-to-ten/perfect", "On a scale from 0 to 10, how satisfied is the customer?", ZERO_TO_TEN)],
  },
  {
    state: "I am completely dissatisfied. Nothing worked and I want to cancel.",
    cases: [low("zero-to-ten/nothing-worked", "On a scale from 0 to 10, how satisfied is the customer?", ZERO_TO_TEN)],
  },
  {
    state: "I hated that concert: the sound was awful and the band played badly.",
    cases: [low("one-to-ten/hated-concert", "From 1 (hated it) to 10 (loved it), how much did the writer enjoy the concert?", ONE_TO_TEN)],
  },
  {
    state: "The best concert of my life, I loved every second of it!",
    cases: [high("one-to-ten/loved-concert", "From 1 (hated it) to 10 (loved it), how much did the writer enjoy the concert?", ONE_TO_TEN)],
  },

  // ---- descriptive levels ----------------------------------------------------
  {
    state: "URGENT: the production server is down and no customer can pay. Please help immediately!",
    cases: [high("urgency/server-down", "How urgent is this message?", URGENCY)],
  },
  {
    state: "No rush at all: whenever you have time next month, could you update my mailing preferences?",
    cases: [low("urgency/no-rush", "How urgent is this message?", URGENCY)],
  },
  {
    state: "This is the third time you have charged me twice! I am furious and I demand an answer NOW!",
    cases: [high("anger/charged-twice-again", "How angry is the writer?", ANGER)],
  },
  {
    state: "Thanks for letting me know, no problem at all. Have a nice day!",
    cases: [low("anger/no-problem", "How angry is the writer?", ANGER)],
  },
  {
    state: "Could you please send me the invoice when you have a moment? Thank you very much for your help.",
    cases: [high("politeness/please-and-thanks", "How polite is the message?", POLITENESS)],
  },
  {
    state: "Send me the invoice now, you useless idiots.",
    cases: [low("politeness/useless-idiots", "How polite is the message?", POLITENESS)],
  },
  {
    state: "The bridge has large cracks and the engineers say it could collapse at any moment.",
    cases: [high("danger/cracked-bridge", "How dangerous is the bridge?", DANGER)],
  },
  {
    state: "The bridge was inspected last week and the engineers say it is in perfect condition.",
    cases: [low("danger/inspected-bridge", "How dangerous is the bridge?", DANGER)],
  },
  {
    state: "I will definitely order from you again. This shop is my favourite!",
    cases: [high("likelihood/buy-again", "How likely is the customer to buy from this shop again?", LIKELIHOOD)],
  },
  {
    state: "I will never buy from this shop again.",
    cases: [low("likelihood/never-again", "How likely is the customer to buy from this shop again?", LIKELIHOOD)],
  },
];

export const SANITY_CASES: SanityCase[] = SANITY_REQUESTS.flatMap((r) => r.cases);
