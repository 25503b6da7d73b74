"""Instruction prompts for self-distillation: the target answers them, and the head learns its answers.

EAGLE heads are trained on the target's *own* responses (the EAGLE papers regenerate ShareGPT answers
with the target), because a head learns the style of the text it sees: a head trained only on source
files drafts badly for chat answers. No chat dataset is available offline, so the prompts are built
here from handwritten templates and topics. Each topic goes wholly to the training or the held-out
split by a hash of its text, so a held-out prompt never shares its topic with a training prompt.
None of them is one of the benchmark's handwritten chat prompts (``benchmarks/bench_eagle3_smollm2.py``).
"""

from __future__ import annotations

import hashlib

TEMPLATES = (
    "Explain {t} to a beginner.",
    "Give me three practical tips about {t}.",
    "Write a short paragraph about {t}.",
    "What are the pros and cons of {t}?",
    "Write a short story that involves {t}.",
    "Summarize the history of {t} in a few sentences.",
    "What are common mistakes people make with {t}?",
    "Write a haiku about {t}.",
    "Describe {t} as if you were talking to a child.",
    "List five interesting facts about {t}.",
    "How would you teach a friend about {t}?",
    "Write an email to a colleague about {t}.",
)

TOPICS = (
    "photosynthesis",
    "black holes",
    "the stock market",
    "climate change",
    "volcanoes",
    "the human heart",
    "machine learning",
    "recycling",
    "electric cars",
    "the Roman Empire",
    "coffee",
    "chess",
    "jazz music",
    "public speaking",
    "time management",
    "budgeting",
    "gardening",
    "yoga",
    "the moon landing",
    "honeybees",
    "rainforests",
    "earthquakes",
    "vaccines",
    "the internet",
    "blockchain",
    "solar panels",
    "wind energy",
    "ocean tides",
    "dinosaurs",
    "the French Revolution",
    "democracy",
    "inflation",
    "credit scores",
    "job interviews",
    "remote work",
    "team meetings",
    "writing a resume",
    "learning to swim",
    "marathon training",
    "healthy breakfasts",
    "baking bread",
    "making pasta",
    "tea ceremonies",
    "origami",
    "photography",
    "oil painting",
    "learning the piano",
    "birdwatching",
    "camping",
    "hiking safety",
    "first aid",
    "fire safety",
    "cybersecurity",
    "passwords",
    "email etiquette",
    "recursion in programming",
    "sorting algorithms",
    "binary numbers",
    "databases",
    "unit testing",
    "version control with git",
    "Python decorators",
    "JavaScript promises",
    "HTTP requests",
    "regular expressions",
    "linked lists",
    "hash tables",
    "cloud computing",
    "operating systems",
    "the periodic table",
    "gravity",
    "magnets",
    "electricity",
    "sound waves",
    "rainbows",
    "snowflakes",
    "the immune system",
    "sleep cycles",
    "nutrition",
    "vitamins",
    "meditation",
    "friendship",
    "kindness",
    "negotiation",
    "leadership",
    "customer service",
    "marketing",
    "small businesses",
    "supply chains",
    "shipping containers",
    "airplanes",
    "trains",
    "bicycles",
    "city planning",
    "libraries",
    "museums",
    "board games",
    "video games",
    "football",
    "tennis",
    "the Olympic Games",
    "mountains",
    "deserts",
    "rivers",
    "islands",
    "penguins",
    "elephants",
    "octopuses",
    "cats",
    "dogs",
    "horses",
    "mushrooms",
    "trees",
    "composting",
    "water conservation",
    "plastic pollution",
    "space exploration",
    "Mars",
    "telescopes",
    "robots",
    "3D printing",
    "smartphones",
    "batteries",
    "the printing press",
    "ancient Egypt",
    "the Silk Road",
    "languages",
    "poetry",
    "novels",
    "theater",
    "film making",
)


def _held_out(topic: str) -> bool:
    """One topic in ten, by a hash of its text (the same on every machine)."""
    return int(hashlib.sha256(topic.encode()).hexdigest(), 16) % 10 == 0


def instruction_prompts(held_out: bool = False) -> list[str]:
    """Every template applied to every topic of one split, in a stable shuffled order (a hash of the
    prompt), so the first ``n`` prompts already mix many topics and templates."""
    topics = [t for t in TOPICS if _held_out(t) == held_out]
    prompts = [template.format(t=topic) for topic in topics for template in TEMPLATES]
    return sorted(prompts, key=lambda p: hashlib.sha256(p.encode()).hexdigest())


__all__ = ["TEMPLATES", "TOPICS", "instruction_prompts"]
