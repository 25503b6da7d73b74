"""Instruction prompts for self-distillation: the target answers them, and the head learns its answers.

EAGLE heads are trained on the target's *own* responses (the EAGLE papers regenerate ShareGPT answers
with the target), because a head learns the style of the text it sees: a head trained only on source
files drafts badly for chat answers. No chat dataset is available offline, so the prompts are built
here from handwritten families, each a set of phrasings (templates) crossed with subjects:

* ``topic`` — questions, explanations and writing tasks about a topic ("Explain {s} to a beginner.");
* ``task`` — how-to requests ("How do I {s}?");
* ``pair`` — comparisons of two things ("What is the difference between {s}?").

These three are ``CORE``, what every release has asked and the default. Six more (``why``, ``suggest``,
``describe``, ``advice``, ``scene``, ``code``) ask the kinds of request a chat user makes that the core
asks little of; they are asked only when named (``families=``), so the core prompts, their order and the
benchmark's held-out instruction prompts stay as they were.

A head trained on one family of phrasings learns the phrasings: the first heads, trained on twelve
templates, reached 0.47 first-draft acceptance on held-out topics of those templates and 0.29 on
differently worded questions. So every prompt also gets an opening and a closing (``OPENINGS``,
``CLOSINGS``: "Quick question: ...", "... Keep it short.") chosen by a hash of its text.

Glossary:
    subject: the topic, task or pair a prompt is about; each subject goes wholly to the training or
        the held-out split by a hash of its text, so a held-out prompt never shares its subject with a
        training prompt.

None of the subjects is one of the benchmark's handwritten chat prompts' subjects
(``training/probes/bench_eagle3_smollm2.py``; a test checks).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

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

# Families added after the first heads (not in ``CORE``): the kinds of request a chat user makes that the
# core families ask little of — why-questions, suggestions, walk-throughs, personal advice, descriptive
# writing and small Python tasks.
WHY_TEMPLATES = (
    "Explain why {s}.",
    "Can you tell me why {s}?",
    "Why is it that {s}?",
    "My niece asked me why {s}. What should I tell her?",
    "What is the reason that {s}?",
    "In a few sentences, explain why {s}.",
)

WHYS = """
cats purr; bread rises in the oven; ice floats on water; cutting onions makes people cry; people yawn;
the ocean is salty; airplanes stay in the air; coffee keeps people awake; the moon seems to change
shape; stars twinkle at night; metal feels colder than wood; we get hiccups; dogs wag their tails; some
birds fly south for the winter; popcorn pops; soap removes grease; bananas turn brown; a rubbed balloon
sticks to a wall; our ears pop on a plane; boats made of steel float; zebras have stripes; iron rusts;
hot air rises; we get goosebumps; flamingos are pink; music can give us chills; a spoon looks bent in a
glass of water; we see lightning before we hear thunder; giraffes have long necks; honey never spoils;
some people are left-handed; time zones exist; cats usually land on their feet; mirrors seem to swap
left and right; we forget most of our dreams; our fingers wrinkle in the bath; leaves are green in
summer; the Titanic sank; old books have a special smell; snakes shed their skin
"""

SUGGEST_TEMPLATES = (
    "Can you suggest {s}?",
    "I need {s}. Any ideas?",
    "Give me three ideas for {s}.",
    "What would you recommend as {s}?",
    "Help me come up with {s}.",
    "Suggest {s} and explain your choice.",
)

SUGGESTIONS = """
a gift for my grandmother; a fun weekend activity for a family with kids; a theme for a birthday party;
a healthy snack to bring to work; a book to read on a long flight; a houseplant for a dark room; a
title for my travel blog; a name for a new coffee shop; a slogan for a recycling campaign; a warm-up
game for a classroom; a hobby I can do at home; a quick breakfast for busy mornings; a team-building
activity for a small office; a date idea on a small budget; a board game for four players; a song to
play at a graduation party; a costume for a school play; a simple science experiment for kids; a
present for a coworker who is leaving; a way to decorate a small bedroom; a lunch to pack for a picnic;
a topic for a school essay; a podcast for someone who likes history; a rainy-day activity for
children; a toast for my best friend's wedding; a caption for a photo of the beach; a color scheme for a
kitchen; a dessert that needs no oven; a weekly exercise routine for beginners; a fun fact to open a
presentation; a pet for a family with allergies; a movie for a family night; a snack for a road trip; a
reward for finishing a big project; an icebreaker question for a meeting
"""

DESCRIBE_TEMPLATES = (
    "Describe {s} in a few sentences.",
    "Walk me through {s}.",
    "Give a simple explanation of {s}.",
    "Explain {s} step by step.",
    "What happens during {s}?",
)

PROCESSES = """
the life cycle of a frog; the digestion of food; the carbon cycle; a solar eclipse; the making of
paper; the passing of a new law; the rock cycle; the making of honey by bees; the growth of a seed into
a plant; the phases of the moon; a volcanic eruption; the making of cheese; the delivery of a letter;
a heartbeat; the making of glass; the change of a caterpillar into a butterfly; the making of chocolate
from cocoa beans; a national election; the building of a bridge; the healing of a cut; the printing of
a newspaper; the minting of coins; the takeoff of an airplane; the shaping of a valley by a river; the
sorting of waste at a recycling plant; the recording of a song in a studio; the making of yogurt; the
growth of tree rings; the formation of a hurricane; the cooling inside a refrigerator; the heating of
food in a microwave; the approval of a bank loan; the working of a car engine; a trial in court; the
brewing of beer; the hatching of a chick; the launch of a rocket; the making of a vaccine
"""

ADVICE_TEMPLATES = (
    "I feel {s}. What can I do?",
    "Any advice for someone who feels {s}?",
    "What are some ways to cope when you feel {s}?",
    "My friend feels {s}. How can I help?",
)

FEELINGS = """
stressed before exams; lonely after moving to a new town; nervous about speaking in public; bored at
work; overwhelmed by housework; anxious about a visit to the doctor; homesick at college; jealous of a
friend's success; tired every afternoon; unsure about changing careers; stuck on a creative project;
left out by coworkers; worried about money; nervous before a first date; sad after losing a pet;
overwhelmed by too many emails; restless on weekends; unfocused while studying; impatient in traffic;
afraid of making mistakes at a new job
"""

CREATIVE_TEMPLATES = (
    "Write a short poem about {s}.",
    "Write a few lines of poetry about {s}.",
    "Write a very short story about {s}.",
    "Describe {s} in vivid detail.",
    "Write a song verse about {s}.",
)

SCENES = """
a quiet snowy morning; the first day of spring; a busy train station; an old lighthouse at night; a cup
of hot cocoa; the smell of rain; a child's first bicycle; waves on a rocky shore; a summer
thunderstorm; a crowded city market; a cat napping in the sun; the last day of school; a candle in a dark
room; a road trip at sunrise; a grandmother's kitchen; a full moon over the sea; fireflies in a
meadow; a lost umbrella; an empty playground; a field of sunflowers; a letter from an old friend; the
sound of a violin; a mountain lake at dawn; a bakery early in the morning; a winter night by the fire;
a kite in the wind; a rainy Monday; a garden after the rain; a ship leaving the harbor; stars over the
desert
"""

CODE_TEMPLATES = (
    "How do I {s} in Python?",
    "Show me how to {s} in Python.",
    "What is the simplest way to {s} in Python?",
    "Explain how to {s} in Python, with a short example.",
)

CODE_TASKS = """
reverse a list; count the words in a string; read a text file line by line; remove duplicates from a
list; sort a dictionary by its values; check if a number is prime; format a date; merge two
dictionaries; find the largest number in a list; convert a string to an integer; write a simple class;
handle an exception; loop over a list with an index; join a list of strings; generate a random number;
write a list comprehension; measure how long a function takes; copy a file; split a string by commas;
round a number to two decimals; load a JSON file; check if a key is in a dictionary; flatten a nested
list; get the current time; give a function a default argument; write a while loop; pair up two lists
with zip; keep only the even numbers of a list
"""

#: the subjects of the benchmark's handwritten chat prompts (``training/probes/bench_eagle3_smollm2.py``
#: ``CHAT``): no family's subject and no self-written prompt (``spec_backend_train.self_prompts``) may
#: mention one, or the "never trained on" chat set would be trained on
BENCHMARK_CHAT_SUBJECTS: tuple[str, ...] = ("autumn", "sleep", "the sky", "vegetarian", "dinner", "tuple")
BENCHMARK_CHAT_SUBJECTS += ("water cycle", "robot", "language")

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
    "why": (WHY_TEMPLATES, _subjects(WHYS)),
    "suggest": (SUGGEST_TEMPLATES, _subjects(SUGGESTIONS)),
    "describe": (DESCRIBE_TEMPLATES, _subjects(PROCESSES)),
    "advice": (ADVICE_TEMPLATES, _subjects(FEELINGS)),
    "scene": (CREATIVE_TEMPLATES, _subjects(SCENES)),
    "code": (CODE_TEMPLATES, _subjects(CODE_TASKS)),
}
#: the families every release has asked (``prompt_items`` without ``families``); the benchmark's held-out
#: instruction prompts are drawn from these, so adding a family elsewhere leaves them unchanged
CORE = ("topic", "task", "pair")


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


def prompt_items(
    held_out: bool = False, variant: int = 0, families: Sequence[str] = CORE
) -> list[tuple[str, str]]:
    """``(subject, prompt)`` for ``families``' templates crossed with their subjects of one split, in a
    stable shuffled order (a hash of the prompt), so the first ``n`` already mix families and phrasings.
    ``variant`` picks the openings and closings (0: the prompts every release has asked)."""
    unknown = [name for name in families if name not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown prompt families {unknown}: choose from {sorted(FAMILIES)}")
    items = [
        (subject, _dressed(template.format(s=subject), variant))
        for templates, subjects in (FAMILIES[name] for name in families)
        for subject in subjects
        if _held_out(subject) == held_out
        for template in templates
    ]
    return sorted(items, key=lambda item: hashlib.sha256(item[1].encode()).hexdigest())


def instruction_prompts(held_out: bool = False) -> list[str]:
    """The prompts of ``prompt_items`` (same order)."""
    return [prompt for _, prompt in prompt_items(held_out)]


def prompt_variants(variants: int, held_out: bool = False, families: Sequence[str] = CORE) -> list[str]:
    """``instruction_prompts`` (of ``families``) followed by their ``variants - 1`` other dressings, each
    prompt once (a dressing drawn twice, or a prompt that gets no opening or closing again, is not
    repeated)."""
    if variants < 1:
        raise ValueError(f"variants must be at least 1, got {variants}")
    seen: dict[str, None] = {}
    for variant in range(variants):
        seen.update(dict.fromkeys(prompt for _, prompt in prompt_items(held_out, variant, families)))
    return list(seen)


__all__ = [
    "BENCHMARK_CHAT_SUBJECTS",
    "CORE",
    "FAMILIES",
    "instruction_prompts",
    "prompt_items",
    "prompt_variants",
]
