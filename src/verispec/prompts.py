"""Prompts written for this project, in Spec-Bench's question format ({"question_id", "category",
"turns"}), two for each of its six kinds of task: multi-turn chat (MT-bench's categories),
translation, summarization, QA, math reasoning and RAG. The demo, the load test and the tests run
on these, so a clone needs no outside data; Spec-Bench itself is read from where it lies
(`verispec.data.find_spec_bench`)."""

from __future__ import annotations

_HARBOUR = (
    "The town of Kestrel Bay rebuilt its harbour wall in 2019 after two winter storms broke it in "
    "three places. The council first planned a concrete wall, but fishermen argued that a rock "
    "breakwater would calm the water inside the harbour better and would be cheaper to repair. "
    "Engineers tested both designs in a wave tank at the regional university. The rock breakwater "
    "reduced wave height inside the harbour by 60 percent, against 45 percent for the concrete "
    "wall, and it cost 2.1 million pounds instead of 3.4 million. Work began in March and ended in "
    "October, one month late because a barge carrying granite ran aground. Since then the harbour "
    "has stayed open through every storm, and the number of boats moored there has grown from 40 "
    "to 65. The council now plans to use the same design for the smaller harbour at Gull Point."
)

_BEES = (
    "Honey bees keep the brood nest of their hive between 32 and 36 degrees Celsius. When the hive "
    "is too cold, worker bees cluster over the brood and shiver their flight muscles without "
    "moving their wings, which produces heat. When the hive is too warm, workers fan their wings "
    "at the entrance to draw air through the combs, and foragers bring back water, which is spread "
    "in thin films over the cells so that it cools the nest as it evaporates. A colony can lose "
    "its ability to regulate temperature when it becomes too small: below a few thousand workers, "
    "there are not enough bees to cover the brood, and the larvae develop more slowly or die."
)

_LIBRARY = (
    "Document 1: The Millbrook public library opens at 9 am on weekdays and at 10 am on Saturdays. "
    "It is closed on Sundays and public holidays. Members may borrow up to eight books for three "
    "weeks, and a loan can be renewed twice online unless another member has reserved the book.\n"
    "Document 2: Since January the library has lent laptops as well as books. A laptop may be "
    "borrowed for seven days by members over sixteen, and it cannot be renewed. A late laptop "
    "costs two pounds a day.\n"
    "Document 3: The reading room on the first floor is quiet study space. Group work takes place "
    "in the two meeting rooms, which can be booked for up to three hours a day."
)

_RIVER = (
    "Passage A: The river Arden rises in the Halden hills and flows 140 kilometres east to the sea "
    "at Port Mallow. Its largest tributary, the Wend, joins it at the market town of Cresby.\n"
    "Passage B: Cresby was founded as a river crossing in the twelfth century. Its stone bridge, "
    "built in 1388, has nine arches and is still used by cars, although lorries have taken the "
    "bypass since 1974.\n"
    "Passage C: Salmon returned to the Arden in 2008, after a weir downstream of Cresby was given a "
    "fish pass. Anglers now need a permit from the river trust between April and October."
)

PROMPTS: list[dict] = [
    {
        "question_id": 1, "category": "writing",
        "turns": [
            "Write a short letter to a neighbour asking them to water your tomato plants while you "
            "are away for a week. Mention when to water and how much.",
            "Now rewrite the letter so that it is half as long and more formal.",
        ],
    },
    {
        "question_id": 2, "category": "reasoning",
        "turns": [
            "Anna is taller than Ben, and Ben is taller than Carl. Dora is shorter than Carl. Who is "
            "the tallest and who is the shortest? Explain step by step.",
            "If Eva is taller than Ben but shorter than Anna, list all five people from tallest to "
            "shortest.",
        ],
    },
    {
        "question_id": 3, "category": "translation",
        "turns": ["Translate French to English: Le musée de la ville sera fermé pendant trois mois pour des "
                  "travaux, mais les expositions temporaires continueront dans la bibliothèque municipale."],
    },
    {
        "question_id": 4, "category": "translation",
        "turns": ["Translate German to English: Der Zug nach Hamburg hatte wegen eines Sturms zwei Stunden "
                  "Verspätung, und viele Reisende mussten in Hannover übernachten."],
    },
    {"question_id": 5, "category": "summarization", "turns": ["Summarize: " + _HARBOUR]},
    {"question_id": 6, "category": "summarization", "turns": ["Summarize: " + _BEES]},
    {"question_id": 7, "category": "qa", "turns": ["What is the boiling point of water at sea level in degrees Celsius?"]},
    {"question_id": 8, "category": "qa", "turns": ["Which planet in the solar system is the largest?"]},
    {
        "question_id": 9, "category": "math_reasoning",
        "turns": ["A baker makes 24 rolls in one batch. She bakes 5 batches and sells all but 18 rolls. "
                  "Each roll costs 40 cents. How much money does she take in?"],
    },
    {
        "question_id": 10, "category": "math_reasoning",
        "turns": ["A train leaves at 2:15 pm and travels 180 kilometres at 72 kilometres per hour. At what "
                  "time does it arrive?"],
    },
    {
        "question_id": 11, "category": "rag",
        "turns": [_LIBRARY + "\n\nUsing the documents above, answer: for how long can a member keep a "
                  "borrowed laptop, and what happens if it is returned late?"],
    },
    {
        "question_id": 12, "category": "rag",
        "turns": [_RIVER + "\n\nUsing the passages above, answer: where does the Wend join the Arden, and "
                  "what happened to the salmon in 2008?"],
    },
]
