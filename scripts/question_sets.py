#!/usr/bin/env python3
"""Writes assay's own labelled question sets: the kinds of question a caller of a
routing or moderation API asks, which the public dev sets lack (a choice with a
description per option, a noul about a message's tone or content, a score whose
levels are described and follow a stated rule). Each item is assembled from
templates by a seeded generator, and its label follows from the parts it was
built from, so the rule behind every label is in this file.

Each set is one kind of question, written to its own file, so that fitting on
the others and scoring on it (leave-one-dataset-out) asks whether a map
carries to a kind it has not seen. `--sets held-out` writes the kinds kept out
of every fit: written while the confidence maps' fitting run read the other
sets, before any map existed, and read by no fit since.

    python3 scripts/question_sets.py --out bench/data [--sets fit|held-out|all]
"""
import argparse
import json
import os
import random

NAMES = ["Dana", "Luis", "Priya", "Tom", "Aiko", "Marta", "Kwame", "Sofia", "Ben", "Yusuf", "Elena", "Chris", "Nora", "Ivan", "Grace", "Omar"]
PRODUCTS = ["the Pro plan", "the mobile app", "the desktop client", "the Basic plan", "the API", "the web dashboard", "the team workspace", "the analytics add-on"]
ITEMS = ["a pair of hiking boots", "a coffee grinder", "a desk lamp", "two phone cases", "a winter jacket", "a blender", "a set of headphones", "a backpack"]


def order_no(r):
    return f"#{r.randint(10000, 99999)}"


def money(r):
    return f"${r.randint(9, 240)}.{r.choice(['00', '50', '99', '49'])}"


# ---- support tickets -------------------------------------------------------

QUEUES = {
    "billing": "charges, invoices, refunds of a payment, wrong or double charges, payment methods",
    "technical": "the product not working: errors, crashes, bugs, features that fail",
    "shipping": "physical orders in transit: delivery dates, tracking, lost or late parcels",
    "account": "logging in, passwords, two-factor codes, changing the account's email or owner",
    "returns": "sending a physical item back, exchanges, damaged or wrong items received",
    "sales": "buying more: prices of plans, quotes, upgrades, discounts for teams",
}

QUEUE_BODIES = {
    "billing": [
        "I was charged {money} twice for {product} this month.",
        "My invoice for {product} shows {money} but my plan costs less than that.",
        "Can you refund the {money} charge from last week? I cancelled {product} before the renewal.",
        "My card was declined when paying for {product}, but the bank says nothing is wrong.",
        "I need a copy of the invoice for order {order} for my accountant, and the VAT number is missing on it.",
        "There is a charge of {money} on my statement that I do not recognise.",
        "Please switch the payment for {product} from my credit card to a bank transfer.",
        "You charged me for {product} after I downgraded to the free tier.",
    ],
    "technical": [
        "{product} crashes every time I open the settings page.",
        "When I export a report from {product} I get 'Error 500' and nothing downloads.",
        "Since the last update, {product} no longer syncs my files.",
        "The search in {product} returns no results even for things I know are there.",
        "Notifications from {product} stopped arriving two days ago.",
        "Uploading an image in {product} freezes the page at 99%.",
        "{product} shows a blank white screen after I sign in.",
        "The graphs in {product} show yesterday's data even after a refresh.",
    ],
    "shipping": [
        "My order {order} ({item}) was supposed to arrive on Monday and it still has not come.",
        "The tracking number for order {order} has not updated in six days.",
        "The courier marked order {order} as delivered, but there is no parcel at my door.",
        "Can you tell me when {item} from order {order} will be dispatched?",
        "I need order {order} delivered to my office instead of my home address, it is still in transit.",
        "Order {order} has been stuck at the sorting centre for a week.",
        "The delivery estimate for {item} keeps moving back. Where is it?",
    ],
    "account": [
        "I cannot log in: the password reset email never arrives.",
        "My two-factor codes are rejected since I changed phones.",
        "I want to change the email address on my account to a new one.",
        "Someone else in my company needs to become the owner of our account, I am leaving.",
        "My account was locked after too many login attempts.",
        "I signed up twice by mistake and want to merge the two accounts.",
        "How do I turn off two-factor authentication? I lost my old phone.",
    ],
    "returns": [
        "{item} from order {order} arrived broken and I would like to send it back.",
        "I received {item} in the wrong size. Can I exchange it?",
        "I want to return {item} (order {order}); it is unused and still in the box.",
        "You sent me {item} instead of what I ordered in order {order}.",
        "How do I print a return label for order {order}?",
        "The zip on {item} broke after one day, I want an exchange.",
        "I sent {item} back two weeks ago; has the return for order {order} been received?",
    ],
    "sales": [
        "What would {product} cost for a team of {n} people?",
        "Do you offer a discount for non-profits on {product}?",
        "We want to upgrade from {product} to the Enterprise plan. Can someone send a quote?",
        "Is there a yearly price for {product} that is cheaper than paying monthly?",
        "We are comparing vendors: can you send pricing for {n} seats and a volume discount?",
        "Can we add {n} more users to {product} and what will that cost?",
        "I would like a demo of {product} before our company buys it.",
    ],
}

ANGRY_OPENERS = [
    "This is unacceptable.", "I am furious.", "Seriously, AGAIN?", "I have had enough of this.",
    "Your service is a joke.", "I am extremely angry right now.", "What a disgrace.", "I'm fed up.",
]
ANGRY_CLOSERS = [
    "Fix it NOW or I am leaving for a competitor.", "I expect an answer today, not another useless template.",
    "This is the worst support I have ever dealt with.", "If this is not sorted I will dispute the payment and post a review everywhere.",
    "Do your job.", "I am done being patient.", "Absolutely ridiculous.",
]
CALM_OPENERS = ["Hi there,", "Hello,", "Good morning,", "Hi team,", "Hello support,", "Hi,", "Dear support team,"]
CALM_CLOSERS = [
    "Thanks in advance for your help!", "No rush, whenever you get a chance.", "Thank you, have a nice day.",
    "Thanks a lot.", "I appreciate your help.", "Many thanks.", "Kind regards.",
]


def balanced(r, classes, n):
    """n labels, the classes as even as n allows, in a shuffled order: a spread subset (eval --limit) keeps the mix."""
    out = [classes[i % len(classes)] for i in range(n)]
    r.shuffle(out)
    return out


def fill(r, template):
    return template.format(money=money(r), product=r.choice(PRODUCTS), order=order_no(r), item=r.choice(ITEMS), n=r.choice([5, 12, 25, 40, 80, 150]))


def ticket(r, queue, angry):
    body = fill(r, r.choice(QUEUE_BODIES[queue]))
    name = r.choice(NAMES)
    if angry:
        text = f"{r.choice(ANGRY_OPENERS)} {body} {r.choice(ANGRY_CLOSERS)}\n{name}"
    else:
        text = f"{r.choice(CALM_OPENERS)}\n{body} {r.choice(CALM_CLOSERS)}\n{name}"
    return text


def tickets_queue(r, n):
    keys = list(QUEUES)
    rows = []
    for i, queue in enumerate(balanced(r, keys, n)):
        rows.append({
            "id": f"tickets-queue-{i}",
            "source": "assay scripts/question_sets.py (generated support tickets)",
            "text": ticket(r, queue, r.random() < 0.4),
            "question": "Which support queue should this ticket be routed to?",
            "options": keys,
            "descriptions": QUEUES,
            "label": queue,
        })
    return rows


def tickets_angry(r, n):
    rows = []
    keys = list(QUEUES)
    for i, angry in enumerate(balanced(r, [True, False], n)):
        rows.append({
            "id": f"tickets-angry-{i}",
            "source": "assay scripts/question_sets.py (generated support tickets)",
            "text": ticket(r, r.choice(keys), angry),
            "question": "Is the customer angry?",
            "answer": angry,
        })
    return rows


# Priority follows a policy stated in the question; a ticket's level is the scenario it was built from.
PRIORITY_LEVELS = [
    "0 - none: no action is needed (thanks, feedback, an update that needs no reply)",
    "1 - low: a question or request with no impact on the customer's work",
    "2 - normal: something is broken but the customer has a workaround",
    "3 - high: one customer is blocked from working or is losing money now",
    "4 - critical: an outage or a security problem affecting many users",
]
PRIORITY_SCENARIOS = [
    [
        "Just wanted to say the new dashboard in {product} looks great.",
        "The issue from last week is solved, you can close my ticket.",
        "Thanks for the quick fix yesterday, everything works.",
        "FYI, we renamed our team in {product}; nothing for you to do.",
        "Great webinar last Thursday, thank you to the whole team.",
    ],
    [
        "Is there a keyboard shortcut to archive items in {product}?",
        "Could you tell me where to find the export settings in {product}? Just curious.",
        "Out of interest, do you plan a dark mode for {product}?",
        "How do I change the language of my notification emails? No hurry.",
        "Where can I read about the new features in {product}?",
    ],
    [
        "The export button in {product} fails, but copying the table by hand works for now.",
        "Images do not load in {product} on Firefox; Chrome works, so I am using that meanwhile.",
        "Search in {product} misses some items, I can still find them by scrolling.",
        "The reminder emails from {product} arrive an hour late, which is annoying but manageable.",
        "Sorting by date is broken in {product}; filtering still lets me find what I need.",
    ],
    [
        "I cannot log in to {product} at all and I have a client presentation in two hours.",
        "{product} rejects every payment from my shop since this morning, I am losing sales.",
        "My account is locked and I cannot do any of my work until it is unlocked.",
        "All my projects disappeared from {product} and I cannot work without them.",
        "Invoices to my customers fail to send from {product}; I cannot get paid until it works.",
    ],
    [
        "{product} is down for our whole company, about {n} people, nobody can sign in.",
        "We think someone got into our account: strangers' logins appear and data was deleted for all our users.",
        "Your API has returned errors for every customer of ours for the last hour.",
        "Every user in our workspace sees other customers' files in {product}. This is a data leak.",
        "The service is completely unreachable for all {n} of our staff.",
    ],
]


def score_kind(r, n, kind, source, levels, question, text_of):
    """A score kind: n rows, the levels as even as n allows, each row's text written by text_of(level)."""
    return [{
        "id": f"{kind}-{i}",
        "source": f"assay scripts/question_sets.py ({source})",
        "text": text_of(level),
        "question": question,
        "levels": levels,
        "level": level,
    } for i, level in enumerate(balanced(r, list(range(len(levels))), n))]


def tickets_priority(r, n):
    def text(level):
        body = fill(r, r.choice(PRIORITY_SCENARIOS[level]))
        return f"{r.choice(CALM_OPENERS)}\n{body} {r.choice(CALM_CLOSERS)}\n{r.choice(NAMES)}"
    return score_kind(r, n, "tickets-priority", "generated support tickets", PRIORITY_LEVELS,
                      "What priority does this ticket get under our support policy? Rate by the impact described, not by the tone.", text)


# ---- messages: does it share contact details (a moderation rule) -----------

CHAT_PLAIN = [
    "Hey, are we still on for the game on Saturday?",
    "The package came today, thanks for sending it so fast.",
    "Can you bring the blue folder to the meeting tomorrow?",
    "I loved the photos from the trip, the lake looks amazing.",
    "Sorry I missed your call, I was in the cinema.",
    "Let's meet at the cafe near the station at 6.",
    "Did you finish the report? The boss asked about it.",
    "My flight lands at 9:40, see you at arrivals.",
    "The recipe needs two eggs, not three, I checked.",
    "Happy birthday! Hope you have a great day.",
]
CONTACT_BITS = [
    "Call me on {phone} when you are free.",
    "My number is {phone}, text me.",
    "Write to me at {email} instead of here.",
    "Send the files to {email}.",
    "You can reach me directly: {phone}.",
    "My personal email is {email}, add me there.",
]
NUMBER_DECOYS = [
    "I scored 42 points in the last round.",
    "The meeting is in room 305 at 14:30.",
    "Order 88213 should arrive by the 12th.",
    "It costs 19.99 and there are 3 left.",
    "Version 2.4.1 fixed the bug.",
]


def contact(r):
    if r.random() < 0.5:
        return f"+{r.randint(1, 49)} {r.randint(100, 999)} {r.randint(100, 999)} {r.randint(1000, 9999)}"
    return f"{r.choice(NAMES).lower()}.{r.choice(['mail', 'post', 'home'])}{r.randint(1, 99)}@{r.choice(['example.com', 'mailbox.org', 'inbox.net'])}"


def messages_contact(r, n):
    rows = []
    for i, shares in enumerate(balanced(r, [True, False], n)):
        parts = [r.choice(CHAT_PLAIN)]
        if r.random() < 0.5:
            parts.append(r.choice(NUMBER_DECOYS))
        if shares:
            bit = r.choice(CONTACT_BITS)
            parts.insert(r.randint(0, len(parts)), bit.format(phone=contact(r) if "{phone}" in bit else "", email=contact(r) if "{email}" in bit else ""))
        rows.append({
            "id": f"messages-contact-{i}",
            "source": "assay scripts/question_sets.py (generated chat messages)",
            "text": " ".join(parts),
            "question": "Does the message share a phone number or an email address?",
            "answer": shares,
        })
    # An email written with a phone-number slot would leave an empty slot: rebuild those.
    for row in rows:
        row["text"] = row["text"].replace("  ", " ")
    return rows


# ---- internal requests: which department ----------------------------------

DEPARTMENTS = {
    "hr": "people matters: leave, hiring, contracts, payslips questions, benefits",
    "it": "computers, accounts, software licences, printers, network access",
    "facilities": "the building: desks, rooms, heating, cleaning, keys and parking",
    "finance": "expenses, purchase orders, supplier invoices, budgets",
    "legal": "contracts with other companies, NDAs, compliance, trademarks",
}
DEPARTMENT_REQUESTS = {
    "hr": [
        "I would like to take parental leave from {month}; what do I need to submit?",
        "We want to hire a second designer for the team, how do I open the position?",
        "My contract says 30 days of holiday but the system shows 25.",
        "Can I switch my health insurance plan before the end of the year?",
        "A new colleague starts on {month} 1st and needs an onboarding plan.",
    ],
    "it": [
        "My laptop will not connect to the office VPN since this morning.",
        "I need a licence for the video editing software for a project.",
        "The printer on the third floor prints blank pages.",
        "Please give the new intern access to the shared drive.",
        "My email keeps asking for my password every five minutes.",
    ],
    "facilities": [
        "The heating in meeting room B is broken and it is freezing.",
        "Can we book the large room for an all-hands on {month} 14th and set up chairs for {n}?",
        "I lost my office key and cannot get into the storage room.",
        "The kitchen on floor two has not been cleaned for days.",
        "I need a parking space for a visitor tomorrow morning.",
    ],
    "finance": [
        "I paid {money} for a client dinner; how do I get reimbursed?",
        "Our supplier says their invoice from {month} is still unpaid.",
        "I need a purchase order for {money} of lab equipment.",
        "How much of the marketing budget is left for this quarter?",
        "My expense report was rejected and I do not know why.",
    ],
    "legal": [
        "A partner company sent us an NDA to sign before the meeting, can someone review it?",
        "We want to register our new product name as a trademark.",
        "The vendor contract renews automatically on {month} 1st; can we still get out of it?",
        "Does our new newsletter sign-up form comply with data protection rules?",
        "A customer is asking us to change the liability clause in their contract.",
    ],
}
MONTHS = ["March", "April", "June", "September", "October", "November"]


def requests_department(r, n):
    keys = list(DEPARTMENTS)
    rows = []
    for i, dept in enumerate(balanced(r, keys, n)):
        body = r.choice(DEPARTMENT_REQUESTS[dept]).format(month=r.choice(MONTHS), n=r.choice([20, 45, 80]), money=money(r))
        text = f"From: {r.choice(NAMES)} ({r.choice(['Marketing', 'Engineering', 'Sales', 'Operations', 'Design'])})\n{body}"
        rows.append({
            "id": f"requests-department-{i}",
            "source": "assay scripts/question_sets.py (generated internal requests)",
            "text": text,
            "question": "Which department should handle this internal request?",
            "options": keys,
            "descriptions": DEPARTMENTS,
            "label": dept,
        })
    return rows


# ---- newsletter items: which section (plain keys, overlapping topics) -------
# No descriptions, and a quarter of the items touch a second section's topic
# in passing, the way AG News's Business and Sci/Tech overlap: the label is the
# headline's subject, which the model can be sure of and still get wrong.

SECTIONS = ["people", "product", "events", "finance"]
SECTION_HEADLINES = {
    "people": [
        "{name} joins the support team as its new lead.",
        "After twelve years with us, {name} retires at the end of {month}.",
        "Congratulations to {name}, who was promoted to engineering manager.",
        "Meet {name}, our new head of recruiting.",
        "{name} from design returns from parental leave next week.",
    ],
    "product": [
        "Version 5 of {product} ships with offline mode.",
        "{product} now exports reports as spreadsheets.",
        "The redesigned settings page of {product} goes live on Tuesday.",
        "Dark mode arrives in {product} after two years of requests.",
        "{product} gets a faster search built on a new index.",
    ],
    "events": [
        "The summer party takes place on {month} 20th in the park next to the office.",
        "Sign up for the charity run on {month} 8th.",
        "The all-hands meeting moves to the large auditorium on Friday.",
        "Our hackathon opens registrations for its {month} edition.",
        "A cooking workshop for staff is held in the canteen next Thursday.",
    ],
    "finance": [
        "Quarterly revenue rose 14% on the back of team subscriptions.",
        "The board approved next year's budget, with travel cut by a fifth.",
        "Expense claims must be filed by the 5th of each month from {month} on.",
        "We closed a {money}M funding round led by two new investors.",
        "Operating costs fell for the third quarter in a row.",
    ],
}
SECTION_ASIDES = {
    "people": "{name} from the team says they are thrilled.",
    "product": "The launch of {product} is mentioned as one reason.",
    "events": "A small celebration is planned for the occasion.",
    "finance": "The project had a budget of {money}M.",
}


def news_section(r, n):
    rows = []
    for i, section in enumerate(balanced(r, SECTIONS, n)):
        fill_in = dict(name=r.choice(NAMES), month=r.choice(MONTHS), product=r.choice(PRODUCTS), money=r.randint(2, 40))
        text = r.choice(SECTION_HEADLINES[section]).format(**fill_in)
        if r.random() < 0.25:
            other = r.choice([s for s in SECTIONS if s != section])
            text = f"{text} {SECTION_ASIDES[other].format(**fill_in)}"
        rows.append({
            "id": f"news-section-{i}",
            "source": "assay scripts/question_sets.py (generated newsletter items)",
            "text": text,
            "question": "Which section of the company newsletter does this item belong to?",
            "options": SECTIONS,
            "label": section,
        })
    return rows


# ---- emails: what should an assistant do with it (described actions) ---------

ACTIONS = {
    "reply": "the sender asks a question or needs an answer from the reader",
    "schedule": "the sender proposes a meeting or a call at a time to put in the calendar",
    "forward": "the email is meant for someone else and should be passed on",
    "archive": "nothing to do: a newsletter, a receipt, a notification or an FYI",
}
ACTION_EMAILS = {
    "reply": [
        "Could you tell me whether the report will be ready by Friday?",
        "Which of the two designs do you prefer for the landing page?",
        "Did you get a chance to look at my proposal? I need your opinion before I send it out.",
        "Can you confirm the shipping address for the samples?",
        "What budget do you have in mind for the campaign?",
    ],
    "schedule": [
        "Are you free for a 30-minute call on Tuesday at 10:00 to go through the plan?",
        "Let's meet on Thursday at 15:00 in room 4 to review the launch.",
        "I have sent a calendar invite for the kickoff on Monday at 9:30.",
        "Could we move our catch-up to Wednesday at 11?",
        "Shall we do the interview next Friday at 14:00?",
    ],
    "forward": [
        "Sorry, I think this should go to your accounts team, not to you: our invoice is attached.",
        "Hi, I am looking for whoever handles press requests at your company.",
        "This is meant for {name} in legal; could you pass it on?",
        "I am not sure you are the right person, but someone in HR should see the attached CV.",
        "Please share this with whoever manages the office building's access cards.",
    ],
    "archive": [
        "Your receipt for order {order}: {money} paid by card.",
        "This week's newsletter: five tips for better sleep.",
        "Notification: your password was changed successfully.",
        "FYI, the office will be closed on Monday for the holiday. No action needed.",
        "Your monthly statement is now available in the portal.",
    ],
}


def emails_action(r, n):
    keys = list(ACTIONS)
    rows = []
    for i, action in enumerate(balanced(r, keys, n)):
        body = r.choice(ACTION_EMAILS[action]).format(name=r.choice(NAMES), order=order_no(r), money=money(r))
        text = f"From: {r.choice(NAMES)}\nSubject: {r.choice(['Quick one', 'Hello', 'Re: last week', 'Update', 'Info'])}\n\n{body}"
        rows.append({
            "id": f"emails-action-{i}",
            "source": "assay scripts/question_sets.py (generated emails)",
            "text": text,
            "question": "What should the assistant do with this email?",
            "options": keys,
            "descriptions": ACTIONS,
            "label": action,
        })
    return rows


# ---- emails: is there a dated request (noul, with dates as decoys) -----------

DATED_REQUESTS = [
    "Please send me the signed contract by {day}.",
    "I need your slides before {day} so I can print them.",
    "Can you fill in the survey by {day}? It closes then.",
    "Please book your travel before {day}, prices go up after that.",
    "Send your feedback on the draft by {day} at the latest.",
]
UNDATED_REQUESTS = [
    "Please send me the signed contract when you can.",
    "Could you have a look at the slides at some point?",
    "Feel free to fill in the survey if you like.",
    "Let me know what you think of the draft whenever suits you.",
]
# A date that asks nothing of the reader.
DATE_DECOYS = [
    "The conference on {past} went well.",
    "I am on holiday from {day}.",
    "The office moved on {past}.",
    "Our meeting on {past} was very useful.",
    "",
]
PAST = ["Monday", "June 12", "the 3rd", "last Wednesday"]
DAYS = ["Friday", "Monday the 3rd", "the end of the month", "June 12", "noon tomorrow", "next Wednesday"]


def emails_deadline(r, n):
    rows = []
    for i, dated in enumerate(balanced(r, [True, False], n)):
        ask = r.choice(DATED_REQUESTS if dated else UNDATED_REQUESTS).format(day=r.choice(DAYS))
        decoy = r.choice(DATE_DECOYS).format(day=r.choice(DAYS), past=r.choice(PAST))
        parts = [p for p in [decoy, ask] if p]
        if r.random() < 0.5:
            parts.reverse()
        rows.append({
            "id": f"emails-deadline-{i}",
            "source": "assay scripts/question_sets.py (generated emails)",
            "text": f"Hi {r.choice(NAMES)},\n{' '.join(parts)}\nBest, {r.choice(NAMES)}",
            "question": "Does the email ask the reader to do something by a specific time?",
            "answer": dated,
        })
    return rows



# ---- messages: how soon a reply is needed (score, 4 described levels) --------
# The level is the scenario's: the message states what is at stake and when.
URGENCY_LEVELS = [
    "0 - no reply needed: an announcement, a thank-you, something to read",
    "1 - this week: a question or request with no date close",
    "2 - today: something is needed before the end of the day",
    "3 - right now: work is stopped or something is failing at this moment",
]
URGENCY_SCENARIOS = [
    [
        "Just a heads-up that the office kitchen gets new coffee machines next month.",
        "Thanks everyone for the great offsite, the photos are in the shared folder.",
        "FYI: the quarterly report is published on the intranet, no action needed.",
        "Welcome {name2} to the team, who joins us from the Berlin office.",
        "The minutes of Monday's meeting are attached for your records.",
    ],
    [
        "When you get a chance this week, could you review my draft of the onboarding guide?",
        "Could you send me the slides from your talk at some point? No rush.",
        "Do you have ideas for the team lunch next month? Let me know by Friday.",
        "Could we find a slot next week to talk about the roadmap?",
        "Would you update your details in the staff directory sometime soon?",
    ],
    [
        "I need your signature on the contract before 5 pm today so it goes out tonight.",
        "Can you send me the figures by this afternoon? The board pack closes at the end of the day.",
        "Please confirm the venue booking today, the hold expires tonight.",
        "The client wants our answer by the end of today; can you check the quote?",
        "Could you approve the expense report today? Payroll closes tonight.",
    ],
    [
        "The checkout on our website is down right now and no customer can pay.",
        "Production is failing at this moment: every order since 10:05 is stuck.",
        "I am locked out of the server in the middle of the release and everything is stopped.",
        "The payment system is rejecting all transactions as we speak.",
        "The whole support team cannot log in at the moment; calls are piling up.",
    ],
]


def messages_urgency(r, n):
    def text(level):
        body = r.choice(URGENCY_SCENARIOS[level]).format(name2=r.choice(NAMES))
        return f"{r.choice(['Hi,', 'Hello all,', 'Hi team,', 'Hey,'])}\n{body}\n{r.choice(NAMES)}"
    return score_kind(r, n, "messages-urgency", "generated workplace messages", URGENCY_LEVELS,
                      "How soon does this message need a reply or an action?", text)


# ---- event feedback: how satisfied (score, 5 short level names) --------------
# Short names are read by name and by their listed position, the other score
# readout: a fit with only numbered described levels would learn one regime.
SATISFACTION_LEVELS = ["very unhappy", "unhappy", "mixed", "happy", "delighted"]
FEEDBACK = [
    ["A waste of a whole day; I left at lunch and want my fee back.", "Badly organised from start to finish and the talks were useless.", "The worst conference I have been to; I will not come again."],
    ["The talks were mostly dull and the rooms too crowded.", "I expected more; the sessions were shallow and ran late.", "Not great: poor sound and little new content."],
    ["Some good talks, some weak ones; the catering was poor.", "The keynote was excellent but the workshops were disorganised.", "Interesting people, but the venue was hard to reach and cold."],
    ["Good talks and well run; I learned a few useful things.", "A nice day overall, the workshops were practical.", "Well organised and friendly; worth the ticket."],
    ["Absolutely brilliant, the best event I have attended in years!", "Every session was superb; I am already booked for next year.", "Outstanding from start to finish, thank you so much!"],
]
FEEDBACK_EXTRAS = ["I attended the second day only.", "This was my first time at the event.", "I came with two colleagues.", "I followed the data track.", ""]


def named_levels(r, n, kind, source, levels, answers, extras, question, lead=""):
    """A score kind with short level names: per row, an answer of the level and an aside, in either order."""
    def text(level):
        parts = [r.choice(extras), r.choice(answers[level])]
        if r.random() < 0.5:
            parts.reverse()
        return lead + " ".join(p for p in parts if p)
    return score_kind(r, n, kind, source, levels, question, text)


def feedback_satisfaction(r, n):
    return named_levels(r, n, "feedback-satisfaction", "generated event feedback", SATISFACTION_LEVELS, FEEDBACK, FEEDBACK_EXTRAS,
                        "How satisfied is the attendee with the event?")


FIT_SETS = {
    "choice_tickets_queue": (tickets_queue, 120),
    "noul_tickets_angry": (tickets_angry, 120),
    "score_tickets_priority": (tickets_priority, 100),
    "noul_messages_contact": (messages_contact, 120),
    "choice_requests_department": (requests_department, 100),
    "choice_news_section": (news_section, 100),
    "choice_emails_action": (emails_action, 100),
    "noul_emails_deadline": (emails_deadline, 100),
    "score_messages_urgency": (messages_urgency, 100),
    "score_feedback_satisfaction": (feedback_satisfaction, 100),
}

# ---- kept out of every fit: kinds no map has seen --------------------------

ASPECTS = {
    "price": "what it cost: too expensive, not worth the money, hidden fees",
    "quality": "how well it is made or works: breaks, stops working, cheap materials",
    "delivery": "getting it: late, lost, damaged in transit, wrong address",
    "service": "the seller's or support's behaviour: rude, no reply, refused help",
    "size": "how it fits or its dimensions: too small, too big, smaller than pictured",
}
ASPECT_COMPLAINTS = {
    "price": [
        "{item} costs twice what the shop down the road asks.",
        "At this price I expected much more from {item}.",
        "They added a handling fee at checkout that was not mentioned anywhere.",
        "Way overpriced for what you get; the same {item} is half the price elsewhere.",
        "The price went up by a third between adding {item} to the cart and paying.",
    ],
    "quality": [
        "{item} stopped working after a week.",
        "The stitching on {item} came apart the first time I used it.",
        "The plastic feels cheap and {item} already has a crack.",
        "{item} makes a grinding noise and switches itself off.",
        "The paint on {item} peeled off within days.",
    ],
    "delivery": [
        "{item} arrived three weeks after the promised date.",
        "The box with {item} was crushed and soaked when the courier left it.",
        "{item} was delivered to a neighbour two streets away.",
        "Tracking said out for delivery for five days before {item} finally showed up.",
        "Half of the order never arrived; {item} came alone.",
    ],
    "service": [
        "I wrote to the seller about {item} four times and never got an answer.",
        "The support agent was rude and hung up on me when I asked about {item}.",
        "They refused to help with {item} and told me it was my problem.",
        "The shop kept promising a call back about {item} that never came.",
        "Customer service sent me copy-paste replies that ignored my question about {item}.",
    ],
    "size": [
        "{item} is far smaller than it looks in the photos.",
        "I ordered my usual size and {item} is two sizes too big.",
        "{item} does not fit on my desk; the listed dimensions are wrong.",
        "{item} is so tight I cannot use it.",
        "{item} is huge, nothing like the size described.",
    ],
}
PRAISE = [
    "Otherwise it does the job.", "The colour is nice though.", "It looked promising at first.",
    "I had high hopes.", "My friend recommended this shop.", "",
]


def reviews_aspect(r, n):
    keys = list(ASPECTS)
    rows = []
    for i, aspect in enumerate(balanced(r, keys, n)):
        complaint = r.choice(ASPECT_COMPLAINTS[aspect]).format(item=r.choice(ITEMS))
        complaint = complaint[0].upper() + complaint[1:]
        text = f"{r.choice([1, 2, 2, 3])} stars. {complaint} {r.choice(PRAISE)}".strip()
        rows.append({
            "id": f"reviews-aspect-{i}",
            "source": "assay scripts/question_sets.py (generated product reviews)",
            "text": text,
            "question": "What is the main complaint of this review about?",
            "options": keys,
            "descriptions": ASPECTS,
            "label": aspect,
        })
    return rows


RECOMMEND_YES = [
    "I would buy {item} again without thinking twice.",
    "Highly recommended, {item} is worth every cent.",
    "Get it, you will not regret it.",
    "Already ordered a second {item} as a gift for my sister.",
    "Five stars, I tell everyone about {item}.",
    "If you are on the fence, just buy {item}.",
]
RECOMMEND_NO = [
    "Save your money and look elsewhere.",
    "I would not buy {item} again.",
    "Do not order {item}; it went straight back.",
    "Avoid. There are better options for the same price.",
    "One star, and only because zero is not possible.",
    "I regret buying {item} and would warn my friends off it.",
]
REVIEW_MIDDLES = [
    "It arrived on time.", "I have used it every day for a month.", "Setup took ten minutes.",
    "The instructions were short.", "It came in a plain box.", "I bought it for my kitchen.",
]


def reviews_recommend(r, n):
    rows = []
    for i, yes in enumerate(balanced(r, [True, False], n)):
        verdict = r.choice(RECOMMEND_YES if yes else RECOMMEND_NO).format(item=r.choice(ITEMS))
        parts = [r.choice(REVIEW_MIDDLES), verdict]
        if r.random() < 0.5:
            parts.reverse()
        rows.append({
            "id": f"reviews-recommend-{i}",
            "source": "assay scripts/question_sets.py (generated product reviews)",
            "text": " ".join(parts),
            "question": "Does the reviewer recommend the product?",
            "answer": yes,
        })
    return rows


# A score kind with described levels, kept out like the review kinds.
DAMAGE_LEVELS = [
    "0 - intact: the item arrived undamaged",
    "1 - cosmetic: a scratch or dent that does not affect use",
    "2 - partly broken: a part is broken or missing but the item still works in part",
    "3 - unusable: the item does not work at all or is destroyed",
]
DAMAGE_REPORTS = [
    ["{item} arrived in perfect condition, well packed.", "Everything was fine with {item}, not a mark on it.", "{item} came safe and sound in its original box."],
    ["There is a small scratch on {item}, but it works fine.", "The box was dented and {item} has a tiny scuff; no problem using it.", "A bit of paint is chipped on {item}, otherwise it is fine."],
    ["One of the parts of {item} snapped off in transit; the rest still works.", "{item} works, but the lid is cracked and a knob is missing.", "The cable of {item} was torn, so only some functions work."],
    ["{item} was smashed to pieces when I opened the box.", "{item} does not switch on at all; the inside rattles.", "{item} arrived soaked and completely dead."],
]


def deliveries_damage(r, n):
    def text(level):
        report = r.choice(DAMAGE_REPORTS[level]).format(item=r.choice(ITEMS))
        return f"Order {order_no(r)}. {report[0].upper() + report[1:]}"
    return score_kind(r, n, "deliveries-damage", "generated delivery reports", DAMAGE_LEVELS,
                      "How badly was the delivered item damaged?", text)


# A score kind with short level names (read by name and by position), written after the score map
# and its spread were fitted: how often a survey respondent exercises.
EXERCISE_LEVELS = ["never", "rarely", "sometimes", "often", "every day"]
EXERCISE_ANSWERS = [
    ["I have not done any exercise in years.", "Sport is just not part of my life at all.", "I don't work out, ever; the sofa is my gym.",
     "I never go running or to the gym.", "Exercise? None whatsoever, I drive everywhere."],
    ["Maybe a walk in the park two or three times a year.", "I went swimming once last summer and that was it.", "Once in a blue moon I play football with my nephews.",
     "I hardly ever exercise, a hike every few months at most.", "I get on my bike a couple of times a year."],
    ["I go for a run when I feel like it, some weeks yes, some weeks no.", "Now and then I join a yoga class, maybe twice a month.", "I swim occasionally, a few times a month.",
     "Some months I train a bit, then I stop for a while.", "I play tennis every other weekend or so."],
    ["I go to the gym three or four times a week.", "I run most weekdays, though I skip the odd one.", "I cycle to the pool several times a week.",
     "Most evenings I do a workout, just not all of them.", "I train four times a week with my club."],
    ["I run every single morning before work, without exception.", "I walk 10 km daily, rain or shine.", "Not a day goes by without my workout.",
     "I do yoga each day of the week, it is part of my routine.", "I cycle to work and back every day of the year."],
]
EXERCISE_EXTRAS = ["I am 34 and work in an office.", "I live in the city centre.", "I have two kids.", "My job keeps me busy.", "I moved here last year.", ""]


def habits_exercise(r, n):
    return named_levels(r, n, "habits-exercise", "generated survey answers", EXERCISE_LEVELS, EXERCISE_ANSWERS, EXERCISE_EXTRAS,
                        "How often does the respondent exercise?", lead="Q: How much exercise do you do? A: ")


# A choice kind with a description per option and a noul about a message's content, written after
# every map shipped on 2026-12-05 was fitted.
TRANSPORT = {
    "train": "rail travel: train tickets, seat reservations, rail passes",
    "flight": "air travel: plane tickets, baggage, check-in, airports",
    "car": "a rental car: pick-up and drop-off, insurance, the car's size",
    "ferry": "a boat crossing: ferry tickets, cabins, taking a vehicle on board",
    "bus": "coach and bus travel: long-distance bus tickets, stops, luggage on the bus",
}
TRANSPORT_REQUESTS = {
    "train": ["Please book me a seat on the {time} intercity to {city}, second class, by the window.",
              "Can you get me a rail pass for the week I am in {city}?",
              "I need a return ticket on the high-speed line to {city}; quiet coach if possible.",
              "Which platform does the overnight sleeper to {city} leave from, and can I still reserve a berth?"],
    "flight": ["Book me on the {time} flight to {city}; I only have hand luggage.",
               "Can I add a checked bag to my booking to {city} and pick an aisle seat?",
               "I need to fly to {city} on Monday; the earliest departure from the main airport, please.",
               "Online check-in for my trip to {city} is not working; can you issue the boarding pass?"],
    "car": ["I need a car from the {city} office on Friday, something small, with full insurance.",
            "Can I drop the car off in {city} instead of where I picked it up?",
            "Please reserve a seven-seater for the weekend in {city}; we are five adults with bags.",
            "Is an automatic available for pick-up at {time} in {city}? I cannot drive manual."],
    "ferry": ["Book a crossing to {city} for two adults and our car, the {time} sailing.",
              "Is there still a cabin on the night boat to {city}?",
              "Can I take my camper van on the crossing to {city}, and what does it cost?",
              "The sea was rough last time; is the {time} sailing to {city} the bigger ship?"],
    "bus": ["Please get me a seat on the {time} coach to {city}; it is cheaper than the train.",
            "Where does the long-distance bus to {city} stop, and can I bring two suitcases?",
            "I need a coach ticket to {city} for Saturday, front seats if there are any.",
            "Can my bike go in the luggage hold of the bus to {city}?"],
}
CITIES = ["Lyon", "Bergen", "Porto", "Krakow", "Split", "Ghent", "Malmo", "Bari"]
TIMES = ["7:15", "9:40", "12:05", "16:30", "18:50", "21:10"]


def trips_transport(r, n):
    keys = list(TRANSPORT)
    rows = []
    for i, mode in enumerate(balanced(r, keys, n)):
        body = r.choice(TRANSPORT_REQUESTS[mode]).format(city=r.choice(CITIES), time=r.choice(TIMES))
        rows.append({
            "id": f"trips-transport-{i}",
            "source": "assay scripts/question_sets.py (generated travel requests)",
            "text": f"{r.choice(['Hi,', 'Hello,', 'Good morning,'])} {body} {r.choice(['Thanks!', 'Best, ' + r.choice(NAMES), 'Cheers.'])}",
            "question": "Which kind of transport is the traveller asking about?",
            "options": keys,
            "descriptions": TRANSPORT,
            "label": mode,
        })
    return rows


# Apologies, against messages that say "sorry" or regret something without apologising for it.
APOLOGY_YES = [
    "Sorry for the late reply, I was out all week.", "My apologies, I sent you the wrong file yesterday.",
    "I apologise for missing the meeting this morning.", "Sorry, that was my mistake: the invoice had the wrong total.",
    "I am really sorry I forgot to call you back.", "Apologies for the confusion in my last email.",
]
APOLOGY_NO = [
    "I am sorry to hear your cat is ill; I hope she gets better soon.", "Sorry to see you go, it was great working with you!",
    "The new schedule starts on Monday.", "Please send the report by Thursday.",
    "It's a pity the concert was cancelled.", "The team felt sorry for the other side after the match.",
]
CHAT_CONTEXT = ["About the project:", "Quick note.", "Re: next week", "", "Hi all,", "One more thing:"]


def messages_apology(r, n):
    rows = []
    for i, yes in enumerate(balanced(r, [True, False], n)):
        body = r.choice(APOLOGY_YES if yes else APOLOGY_NO)
        rows.append({
            "id": f"messages-apology-{i}",
            "source": "assay scripts/question_sets.py (generated chat messages)",
            "text": f"{r.choice(CHAT_CONTEXT)} {body} {r.choice(NAMES)}".strip(),
            "question": "Does the writer apologise for something they did or failed to do?",
            "answer": yes,
        })
    return rows


HELD_OUT_SETS = {
    "choice_reviews_aspect": (reviews_aspect, 100),
    "noul_reviews_recommend": (reviews_recommend, 100),
    "score_deliveries_damage": (deliveries_damage, 100),
    "score_habits_exercise": (habits_exercise, 100),
    "choice_trips_transport": (trips_transport, 100),
    "noul_messages_apology": (messages_apology, 100),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sets", choices=["fit", "held-out", "all"], default="all")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sets = {**(FIT_SETS if args.sets in ("fit", "all") else {}), **(HELD_OUT_SETS if args.sets in ("held-out", "all") else {})}
    for name, (make, n) in sets.items():
        # One generator per set, seeded by its name: adding a set changes no other.
        r = random.Random(name)
        rows = make(r, n)
        with open(os.path.join(args.out, f"{name}.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
