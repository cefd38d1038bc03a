"""Repetitive workloads written for this project, in Spec-Bench's question format: the kind of
traffic suffix decoding is for (agents, extraction jobs, templated batch work), built from our own
templates, so a clone needs no outside data. `verispec bench --questions repetitive`.

- batch_extraction: one instruction over many inputs (product listings to JSON records, the same fields
  each time): the answers share their structure, so earlier answers predict later ones;
- editing: one document edited step by step over several turns, each answer the whole document
  again with one change: each answer mostly copies the previous one.

Every question is generated from the templates below in a fixed order (no randomness).
"""

from __future__ import annotations

_PRODUCTS = [
    ("kettle", "Hartwell", "stainless steel", "1.7 litres", 34.99),
    ("desk lamp", "Lumo", "matte black", "45 cm", 22.50),
    ("backpack", "Trailfox", "forest green", "28 litres", 59.00),
    ("coffee grinder", "Brewmoor", "copper", "20 cm", 41.25),
    ("yoga mat", "Stillwater", "lavender", "183 x 61 cm", 27.80),
    ("rain jacket", "Northgate", "navy blue", "size M", 89.95),
    ("blender", "Vortix", "white", "1.5 litres", 64.00),
    ("water bottle", "Hydra", "sky blue", "750 ml", 18.40),
    ("office chair", "Ergon", "charcoal grey", "adjustable", 149.00),
    ("toaster", "Crispin", "cream", "2 slices", 29.99),
    ("headphones", "Sonera", "silver", "over-ear", 119.00),
    ("frying pan", "Castell", "cast iron", "28 cm", 45.60),
    ("umbrella", "Skyward", "red", "105 cm", 16.75),
    ("alarm clock", "Tempo", "wooden", "12 cm", 24.30),
    ("hiking boots", "Ridgeline", "brown", "size 42", 112.00),
    ("wall clock", "Horae", "brass", "30 cm", 38.90),
    ("bike helmet", "Velox", "orange", "size L", 54.95),
    ("picnic blanket", "Meadow", "tartan", "150 x 200 cm", 31.20),
    ("electric toothbrush", "Brightly", "mint", "standard", 47.00),
    ("bookshelf", "Oakridge", "walnut", "180 cm", 129.50),
]

_EXTRACT = (
    "Extract the product from this listing as a JSON object with the keys \"name\", \"brand\", "
    "\"color\", \"size\" and \"price_gbp\" (a number). Answer with the JSON object only.\n\n"
    "Listing: {listing}"
)

_LISTING = (
    "New in our shop this week: the {brand} {name}. Finished in {color}, it measures {size} and "
    "comes with a two-year guarantee. Price: {price:.2f} pounds, free delivery on orders over 50 pounds."
)

_NOTICES = [
    ("the community garden", "Saturday 14 June", "10 am", "the garden gate on Elm Street", "gloves and a trowel"),
    ("the beach clean-up", "Sunday 6 July", "9 am", "the lifeguard hut", "a hat and a water bottle"),
    ("the library book sale", "Saturday 20 September", "11 am", "the main entrance", "a bag for your books"),
    ("the school fun run", "Friday 3 October", "2 pm", "the sports field", "running shoes"),
    ("the river walk", "Sunday 19 October", "10 am", "the old bridge", "boots and a raincoat"),
    ("the charity bake sale", "Saturday 8 November", "12 noon", "the church hall", "a cake to share"),
    ("the tree planting day", "Saturday 29 November", "9 am", "the park cafe", "warm clothes"),
    ("the winter market", "Saturday 13 December", "3 pm", "the town square", "a reusable bag"),
    ("the carol concert", "Sunday 21 December", "6 pm", "the bandstand", "a torch"),
    ("the new year swim", "Thursday 1 January", "11 am", "the harbour steps", "a towel"),
]

_NOTICE = (
    "Please join us for {event} on {day}. We will meet at {time} at {place}. Please bring {bring}. "
    "Tea and biscuits will be provided, and children are welcome if they come with an adult. If the "
    "weather is very bad, we will post a message on the village website by 8 am on the day."
)

_EDITS = [
    "Here is a notice for the village newsletter:\n\n{notice}\n\nRewrite the notice with a short title "
    "on its own line above it. Return the whole notice.",
    "Now change the meeting time to one hour later. Return the whole notice with its title.",
    "Now add a last sentence asking people to reply to the organiser, Sam Patel, by the day before. "
    "Return the whole notice with its title.",
]


def repetitive_questions() -> list[dict]:
    """The extraction questions (ids 1001..) then the editing ones (ids 2001..)."""
    out: list[dict] = []
    for i, (name, brand, color, size, price) in enumerate(_PRODUCTS):
        listing = _LISTING.format(name=name, brand=brand, color=color, size=size, price=price)
        out.append({"question_id": 1001 + i, "category": "batch_extraction", "turns": [_EXTRACT.format(listing=listing)]})
    for i, (event, day, time, place, bring) in enumerate(_NOTICES):
        notice = _NOTICE.format(event=event, day=day, time=time, place=place, bring=bring)
        turns = [_EDITS[0].format(notice=notice), *_EDITS[1:]]
        out.append({"question_id": 2001 + i, "category": "editing", "turns": turns})
    return out
