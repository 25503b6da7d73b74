"""Instruction prompts for self-distillation: the target answers them, and the head learns its answers.

EAGLE heads are trained on the target's *own* responses (the EAGLE papers regenerate ShareGPT answers
with the target), because a head learns the style of the text it sees: a head trained only on source
files drafts badly for chat answers. No chat dataset is available offline, so the prompts are built
here from handwritten families, each a set of phrasings (templates) crossed with subjects:

* ``topic`` — questions, explanations and writing tasks about a topic ("Explain {s} to a beginner.");
* ``task`` — how-to requests ("How do I {s}?");
* ``pair`` — comparisons of two things ("What is the difference between {s}?").

A head trained on one family of phrasings learns the phrasings: the first heads, trained on twelve
templates, reached 0.47 first-draft acceptance on held-out topics of those templates and 0.29 on
differently worded questions. So every prompt also gets an opening and a closing (``OPENINGS``,
``CLOSINGS``: "Quick question: ...", "... Keep it short.") chosen by a hash of its text.

Glossary:
    subject: the topic, task or pair a prompt is about; each subject goes wholly to the training or
        the held-out split by a hash of its text, so a held-out prompt never shares its subject with a
        training prompt.

None of the subjects is one of the benchmark's handwritten chat prompts' subjects
(``benchmarks/bench_eagle3_smollm2.py``; a test checks).
"""

from __future__ import annotations

import hashlib

TEMPLATES = (
    "Explain {s} to a beginner.",
    "Give me three practical tips about {s}.",
    "Write a short paragraph about {s}.",
    "What are the pros and cons of {s}?",
    "Write a short story that involves {s}.",
    "Summarize the history of {s} in a few sentences.",
    "What are common mistakes people make with {s}?",
    "Write a haiku about {s}.",
    "Describe {s} as if you were talking to a child.",
    "List five interesting facts about {s}.",
    "How would you teach a friend about {s}?",
    "Write an email to a colleague about {s}.",
    "What is {s}?",
    "Why is {s} important?",
    "How does {s} work?",
    "Can you tell me something surprising about {s}?",
    "Write a limerick about {s}.",
    "Write a four-line poem about {s}.",
    "Write a short dialogue between two friends talking about {s}.",
    "What should everyone know about {s}?",
    "Give me a fun quiz question about {s}, with the answer.",
    "Write a tweet about {s}.",
    "What are some myths about {s}?",
    "I have to give a two-minute talk on {s}. Can you outline it?",
    "Write a product description for a book about {s}.",
    "What would the world be like without {s}?",
    "Describe {s} in one sentence, then in one paragraph.",
    "What questions should I ask an expert on {s}?",
    "Write a diary entry from someone who just discovered {s}.",
    "Tell me a joke about {s}.",
)

TOPICS = """
photosynthesis; black holes; the stock market; climate change; volcanoes; the human heart;
machine learning; recycling; electric cars; the Roman Empire; coffee; chess; jazz music; public speaking;
time management; budgeting; gardening; yoga; the moon landing; honeybees; rainforests; earthquakes;
vaccines; the internet; blockchain; solar panels; wind energy; ocean tides; dinosaurs; the French
Revolution; democracy; inflation; credit scores; job interviews; remote work; team meetings; writing a
resume; learning to swim; marathon training; healthy breakfasts; baking bread; making pasta; tea
ceremonies; origami; photography; oil painting; learning the piano; birdwatching; camping; hiking
safety; first aid; fire safety; cybersecurity; passwords; email etiquette; recursion in programming;
sorting algorithms; binary numbers; databases; unit testing; version control with git; Python
decorators; JavaScript promises; HTTP requests; regular expressions; linked lists; hash tables; cloud
computing; operating systems; the periodic table; gravity; magnets; electricity; sound waves; rainbows;
snowflakes; the immune system; nutrition; vitamins; meditation; friendship; kindness; negotiation;
leadership; customer service; marketing; small businesses; supply chains; shipping containers;
airplanes; trains; bicycles; city planning; libraries; museums; board games; video games; football;
tennis; the Olympic Games; mountains; deserts; rivers; islands; penguins; elephants; octopuses; cats;
dogs; horses; mushrooms; trees; composting; water conservation; plastic pollution; space exploration;
Mars; telescopes; 3D printing; smartphones; batteries; the printing press; ancient Egypt; the Silk
Road; poetry; novels; theater; film making; volunteering; the Renaissance; glaciers; coral reefs;
wolves; whales; owls; spiders; butterflies; the Amazon river; the Sahara; Antarctica; thunderstorms;
hurricanes; fog; the seasons of the year; lighthouses; castles; pyramids; bridges; skyscrapers; tunnels;
the wheel; clocks; maps; compasses; money; banks; taxes; insurance; renting an apartment; buying a car;
moving to a new city; starting college; studying for exams; taking notes; reading habits; handwriting;
calligraphy; knitting; pottery; woodworking; sculpture; ballet; hip hop; classical music; guitars;
drums; choirs; podcasts; newspapers; radio; television; social media; online privacy; video calls;
spreadsheets; presentations; project management; job promotions; mentoring; teamwork; conflict at work;
giving feedback; saying no politely; making friends as an adult; parenting toddlers; grandparents;
pets for small apartments; houseplants; bird feeders; beekeeping; farming; fishing; sailing; surfing;
skiing; rock climbing; running shoes; stretching; posture; drinking enough water; spices; chocolate;
cheese; bread around the world; street food; restaurants; table manners; birthday parties; weddings;
holidays around the world; fireworks; magic tricks; puzzles; crosswords; mathematics; prime numbers;
fractions; probability; statistics; geometry; algebra; the speed of light; atoms; DNA; evolution;
fossils; bacteria; viruses; the brain; memory; dreams; emotions; habits; happiness; curiosity;
creativity; patience; honesty; courage; compilers; web browsers; APIs; open source software; code
reviews; debugging; memory leaks; multithreading; encryption; artificial intelligence; chatbots;
self-driving cars; drones; satellites; GPS; the ocean floor; submarines; trains of the future
"""

TASK_TEMPLATES = (
    "How do I {s}?",
    "What is the easiest way to {s}?",
    "Give me step-by-step instructions to {s}.",
    "I want to {s}. Where should I start?",
    "What do I need to {s}?",
    "What mistakes should I avoid when I try to {s}?",
    "Can you help me plan how to {s} this week?",
    "My friend wants to {s}. What advice would you give?",
)

TASKS = """
fix a flat bicycle tire; cook rice on the stove; make a budget for the month; write a cover letter;
learn to juggle; clean a laptop keyboard; start a vegetable garden; train a puppy; paint a room; tie a
tie; make a paper airplane; save money on groceries; prepare for a job interview; run my first 5k;
organize my closet; start a blog; learn to draw; write a thank-you note; plan a road trip; make
pancakes; set up a home office; back up my photos; write a Python function that reverses a string;
read a CSV file in Python; center a div with CSS; undo the last commit in git; write a unit test;
find a bug in my code; speed up a slow website; choose a strong password; keep a journal; make new
friends at work; ask for a raise; give a good presentation; remember names; study more effectively;
wake up earlier; drink less coffee; care for a cactus; make cold brew coffee; brew green tea; make a
smoothie; bake chocolate chip cookies; host a board game night; pack for a week-long trip; fold a fitted
sheet; remove a coffee stain; change a light bulb safely; build a birdhouse; start running again after
an injury; meditate for ten minutes a day; write a short story; learn chess openings; solve a Rubik's
cube; improve my handwriting; take better photos with my phone; edit a video; record a podcast; write
a good email subject line; negotiate the price of a used car; apologize to a friend; plan a surprise
party; teach a child to ride a bike; make a family tree; start composting at home; reduce food waste;
lower my electricity bill; stay focused while working from home; prepare for a marathon; sort a list
in JavaScript; use a hash map; read a research paper; write a haiku; memorize a speech
"""

PAIR_TEMPLATES = (
    "What is the difference between {s}?",
    "Compare {s}.",
    "Which is better for a beginner: {s}?",
    "How are {s} alike, and how are they different?",
)

PAIRS = """
cats and dogs; tea and coffee; weather and climate; viruses and bacteria; a lake and a pond; a
crocodile and an alligator; stocks and bonds; renting and buying a home; trains and planes for travel;
running and swimming; the violin and the cello; a poem and a song; fiction and nonfiction; Java and
JavaScript; RAM and storage; a compiler and an interpreter; HTTP and HTTPS; SQL and NoSQL databases;
a library and a framework; frogs and toads; butterflies and moths; rabbits and hares; a hurricane and
a tornado; the sun and the moon; jam and jelly; baking soda and baking powder; a cold and the flu;
email and letters; books and movies; chess and checkers; soccer and basketball; a city and a village;
saving and investing; a laptop and a desktop computer; acrylic and oil paint; a democracy and a
monarchy; speed and velocity; mass and weight; atoms and molecules; rivers and streams
"""

OPENINGS = ("", "", "", "", "Hi! ", "Quick question: ", "Please help me. ", "I'm curious. ", "Hello. ")
CLOSINGS = (
    "",
    "",
    "",
    "",
    " Keep it short.",
    " Use simple words.",
    " Answer in two or three sentences.",
    " Be specific.",
    " Use a numbered list.",
    " Thanks!",
)


def _subjects(text: str) -> list[str]:
    return [" ".join(s.split()) for s in text.split(";") if s.strip()]


FAMILIES = {
    "topic": (TEMPLATES, _subjects(TOPICS)),
    "task": (TASK_TEMPLATES, _subjects(TASKS)),
    "pair": (PAIR_TEMPLATES, _subjects(PAIRS)),
}


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def _held_out(subject: str) -> bool:
    """One subject in ten, by a hash of its text (the same on every machine)."""
    return _hash(subject) % 10 == 0


def _dressed(prompt: str, variant: int = 0) -> str:
    """The prompt with an opening and a closing chosen by its hash (most get neither); ``variant``
    ``k > 0`` draws another pair by the hash of the prompt and ``k``."""
    h = _hash(prompt if variant == 0 else f"{prompt}#{variant}")
    return OPENINGS[h % len(OPENINGS)] + prompt + CLOSINGS[(h // len(OPENINGS)) % len(CLOSINGS)]


def prompt_items(held_out: bool = False, variant: int = 0) -> list[tuple[str, str]]:
    """``(subject, prompt)`` for every family's templates crossed with its subjects of one split, in a
    stable shuffled order (a hash of the prompt), so the first ``n`` already mix families and phrasings.
    ``variant`` picks the openings and closings (0: the prompts every release has asked)."""
    items = [
        (subject, _dressed(template.format(s=subject), variant))
        for templates, subjects in FAMILIES.values()
        for subject in subjects
        if _held_out(subject) == held_out
        for template in templates
    ]
    return sorted(items, key=lambda item: hashlib.sha256(item[1].encode()).hexdigest())


def instruction_prompts(held_out: bool = False) -> list[str]:
    """The prompts of ``prompt_items`` (same order)."""
    return [prompt for _, prompt in prompt_items(held_out)]


def prompt_variants(variants: int, held_out: bool = False) -> list[str]:
    """``instruction_prompts`` followed by their ``variants - 1`` other dressings, each prompt once
    (a dressing drawn twice, or a prompt that gets no opening or closing again, is not repeated)."""
    if variants < 1:
        raise ValueError(f"variants must be at least 1, got {variants}")
    seen: dict[str, None] = {}
    for variant in range(variants):
        seen.update(dict.fromkeys(prompt for _, prompt in prompt_items(held_out, variant)))
    return list(seen)


__all__ = ["FAMILIES", "instruction_prompts", "prompt_items", "prompt_variants"]
