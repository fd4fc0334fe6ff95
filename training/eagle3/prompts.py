"""The prompt set a draft head is trained and evaluated on: handwritten seeds plus variations.

`build_prompts(seed)` returns chat message lists in four kinds (open chat, tool calls, JSON, code),
shuffled deterministically. `split(prompts)` holds out every `EVAL_EVERY`-th prompt for
`edgerun draft eval`, so the evaluation never sees a training prompt.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from training.eagle3 import prompt_seeds as seeds

EVAL_EVERY = 20

TOPICS = [
    "volcanoes", "the Roman Empire", "solar panels", "coral reefs", "the human heart", "electric cars",
    "the French Revolution", "honeybees", "black holes", "the stock market", "rainforests", "jazz music",
    "the moon landing", "antibiotics", "glaciers", "the printing press", "dinosaurs", "nuclear energy",
    "the Great Wall of China", "sleep", "chess", "tea", "the Olympic Games", "penguins", "the immune system",
    "wind turbines", "ancient Egypt", "cloud computing", "recycling", "the Amazon river", "meditation",
    "bread baking", "tides", "the piano", "deserts", "satellites", "photosynthesis", "mountains",
    "the Renaissance", "earthquakes", "elephants", "coffee", "the violin", "the Milky Way", "batteries",
    "bicycles", "pyramids", "whales", "rain", "the alphabet", "robots", "vitamins", "libraries", "bridges",
]
CHAT_TEMPLATES = [
    "Explain {t} in simple terms.", "Tell me three interesting facts about {t}.", "Write a short paragraph about {t}.",
    "What are the pros and cons of {t}?", "Why is {t} important?", "Write a short poem about {t}.",
    "How would you describe {t} to a child?", "What is the history of {t}?", "Give me a quiz question about {t}.",
    "What are common misconceptions about {t}?",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust", "Java", "C"]
CODE_JOBS = [
    "reverses a list", "counts vowels in a string", "returns the sum of the digits of a number",
    "checks whether a year is a leap year", "converts celsius to fahrenheit", "finds the second largest number in a list",
    "returns the average of a list of numbers", "capitalises every word in a sentence", "computes the greatest common divisor",
    "checks whether two strings are anagrams", "returns the squares of the numbers from 1 to n", "parses a date string",
]
# Everyday chat beyond "explain a topic": stories, advice, ideas, opinions, descriptions, comparisons
STORY_SUBJECTS = [
    "a lost robot", "a baker who could fly", "a dragon afraid of the dark", "two friends on a train", "a talking tree",
    "a detective cat", "a girl who found a map", "an old fisherman", "a city under the sea", "a forgotten toy",
    "a time traveller", "a shy giant", "a clockmaker", "a musician in the rain", "a fox and a crow", "a snowman in summer",
]
STORY_TEMPLATES = ["Tell me a short story about {s}.", "Write a bedtime story about {s}.", "Write the opening of a novel about {s}."]
GOALS = [
    "sleep better", "eat healthier", "learn to cook", "save money", "make new friends", "stay focused while studying",
    "get fit at home", "keep a plant alive", "prepare for a job interview", "travel on a budget", "read more books",
    "manage my time", "feel less anxious", "learn to draw", "keep my room tidy", "write better essays",
]
GOAL_TEMPLATES = [
    "What are some good ways to {g}?", "How can I {g}?", "Give me five tips to {g}.", "I want to {g}. Where do I start?",
]
IDEA_TOPICS = [
    "a rainy afternoon", "a team-building event", "a school science project", "a first date", "a family weekend",
    "a small business", "a garden party", "a gift for my grandmother", "a podcast", "a Halloween costume",
]
IDEA_TEMPLATES = ["Give me three ideas for {i}.", "Suggest some fun activities for {i}.", "Brainstorm ideas for {i}."]
CREATURES = ["dogs", "cats", "birds", "fish", "horses", "owls", "ants", "dolphins", "squirrels", "parrots"]
CREATURE_HABITS = [
    "Why do {c} sleep so much?", "How do {c} communicate?", "What do {c} eat?", "Why do people keep {c} as pets?",
]
PLACES = ["a beach town", "a mountain cabin", "a busy market", "a quiet library", "a space station", "a medieval castle"]
PLACE_TEMPLATES = ["Describe {p} in vivid detail.", "What would a day in {p} be like?", "Describe your ideal day in {p}."]
PAIRS = [
    ("tea", "coffee"), ("cats", "dogs"), ("summer", "winter"), ("books", "films"), ("trains", "planes"),
    ("city life", "country life"), ("running", "swimming"), ("email", "phone calls"), ("renting", "buying a home"),
]
PAIR_TEMPLATES = ["What is the difference between {a} and {b}?", "Which is better, {a} or {b}? Explain.",
                  "Compare {a} and {b} in a few sentences."]

ENTITIES = [
    ("person", "name, age, email"), ("movie", "title, director, year, rating"), ("city", "name, country, population"),
    ("product", "id, name, price, in_stock"), ("song", "title, artist, duration_seconds"), ("employee", "id, name, role, salary"),
    ("restaurant", "name, cuisine, rating, address"), ("flight", "number, origin, destination, departure"),
    ("laptop", "brand, model, ram_gb, price"), ("student", "name, grade, subjects"),
]


@dataclass(slots=True, frozen=True)
class Prompt:
    kind: str  # "chat" | "tool" | "json" | "code"
    messages: tuple[dict[str, str], ...]


def user(text: str, system: str | None = None) -> tuple[dict[str, str], ...]:
    head = ({"role": "system", "content": system},) if system else ()
    return head + ({"role": "user", "content": text},)


def tool_system(tools: list[seeds.ToolSeed]) -> str:
    specs = [
        {"name": name, "description": desc, "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in params.items()}}}
        for name, desc, params, _ in tools
    ]
    return (
        "You can call these tools:\n" + json.dumps(specs) + "\nTo call a tool, reply with JSON only: "
        '{"name": <tool name>, "arguments": {...}}'
    )


def build_prompts(seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    out = [Prompt("chat", user(text)) for text in seeds.CHAT]
    out += [Prompt("chat", user(tpl.format(t=topic))) for topic in TOPICS for tpl in rng.sample(CHAT_TEMPLATES, 4)]
    out += [Prompt("chat", user(tpl.format(s=s))) for s in STORY_SUBJECTS for tpl in rng.sample(STORY_TEMPLATES, 2)]
    out += [Prompt("chat", user(tpl.format(g=g))) for g in GOALS for tpl in rng.sample(GOAL_TEMPLATES, 2)]
    out += [Prompt("chat", user(tpl.format(i=i))) for i in IDEA_TOPICS for tpl in rng.sample(IDEA_TEMPLATES, 2)]
    out += [Prompt("chat", user(tpl.format(c=c))) for c in CREATURES for tpl in rng.sample(CREATURE_HABITS, 2)]
    out += [Prompt("chat", user(tpl.format(p=p))) for p in PLACES for tpl in PLACE_TEMPLATES]
    out += [Prompt("chat", user(tpl.format(a=a, b=b))) for a, b in PAIRS for tpl in rng.sample(PAIR_TEMPLATES, 2)]
    for i, tool in enumerate(seeds.TOOLS):
        for request in tool[3]:
            others = rng.sample([t for j, t in enumerate(seeds.TOOLS) if j != i], 2)
            out.append(Prompt("tool", user(request, tool_system([tool]))))
            out.append(Prompt("tool", user(request, tool_system(rng.sample([tool, *others], 3)))))
    out += [Prompt("json", user(text)) for text in seeds.JSON_TASKS]
    for entity, fields in ENTITIES:
        out.append(Prompt("json", user(f"Return a JSON object for a {entity} with the fields {fields}. JSON only.")))
        out.append(Prompt("json", user(f"Give me a JSON array of three {entity}s, each with {fields}.")))
    out += [Prompt("code", user(text)) for text in seeds.CODE_TASKS]
    out += [Prompt("code", user(f"Write a {lang} function that {job}.")) for job in CODE_JOBS for lang in rng.sample(LANGUAGES, 3)]
    rng.shuffle(out)
    return out


def split(prompts: list[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held out): every EVAL_EVERY-th prompt is held out."""
    train = [p for i, p in enumerate(prompts) if i % EVAL_EVERY != EVAL_EVERY - 1]
    held_out = [p for i, p in enumerate(prompts) if i % EVAL_EVERY == EVAL_EVERY - 1]
    return train, held_out
