"""The capacity bench's chat prompts: natural text cut to an exact token count under the model's chat template.

    mix a   a passage and "continue it"; sent with max_tokens and ignore_eos (every answer is exactly that long)
    mix b   a passage and a short question that asks for one sentence; no max_tokens (the answer ends at EOS)

Every prompt of a run is the same length in tokens once rendered with the chat template (system prompt and role
markers included), as a benchmark client's "random" dataset is; the passages are seeded shuffles of one list of
plain sentences, so prompts differ (no prefix-cache hits beyond the template) and the model sees real language.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

SENTENCES = (
    "The river rose for three days after the storm and covered the lower fields.",
    "Most bread is made from flour, water, salt and yeast, left to rise before it is baked.",
    "The old lighthouse on the northern cape has guided fishing boats home for two hundred years.",
    "Bees visit thousands of flowers in a single day to collect nectar for their hive.",
    "A train from the capital reaches the coast in a little under four hours.",
    "The library opens at nine in the morning and closes at eight in the evening on weekdays.",
    "Copper conducts electricity well, which is why it is used in most household wiring.",
    "Every spring the village holds a market where farmers sell cheese, honey and apples.",
    "The museum's new wing shows paintings and tools from the early days of the city.",
    "Mountain roads are often closed in winter because snow makes them dangerous to drive.",
    "She planted tomatoes, beans and basil along the sunny side of the garden.",
    "The bridge was repainted last summer, and the work took almost two months.",
    "Owls hunt mostly at night and can turn their heads much further than people can.",
    "A good map shows rivers, roads, towns and the height of the land.",
    "The school added a music room where students can practise piano and guitar.",
    "Rain water is collected in a tank on the roof and used to water the plants.",
    "The committee met on Tuesday to plan the route of the new cycling path.",
    "Glass is made by heating sand with soda and lime until the mixture melts.",
    "The baker starts work at four in the morning so the bread is ready at seven.",
    "Whales travel thousands of kilometres each year between feeding and breeding waters.",
    "The town hall clock was stopped for a week while its gears were cleaned.",
    "Wool keeps sheep warm in winter and is spun into yarn after the spring shearing.",
    "The orchestra rehearsed the symphony twice before the evening concert.",
    "A compass needle points north because it lines up with the Earth's magnetic field.",
    "The harbour is busiest in the early morning, when the fishing boats come back.",
    "Maple trees turn bright red and orange in the autumn before their leaves fall.",
    "The new bus line connects the university with the hospital and the station.",
    "Clay pots keep water cool because a little of it evaporates through their walls.",
    "The hikers reached the top of the hill just as the fog began to lift.",
    "Salt was once so valuable that it was traded for gold in some markets.",
    "The children built a small boat out of wood and tested it on the pond.",
    "Solar panels on the factory roof provide about a third of its electricity.",
    "The festival ended with fireworks over the lake at midnight.",
    "Farmers rotate their crops so that the soil does not lose its nutrients.",
    "The post office sorts letters by postcode before they are sent out for delivery.",
    "Tea was first grown in China and later spread to India and many other countries.",
    "The old mill by the stream still grinds grain with the power of the water wheel.",
    "A thermometer measures temperature, and a barometer measures air pressure.",
    "The volunteers cleaned the beach and filled forty bags with plastic and glass.",
    "Snow fell quietly through the night and covered the roofs of the houses.",
)

QUESTIONS = (
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "How many days are there in a week?",
    "What colour is the sky on a clear day?",
    "What do bees make?",
    "Which planet is closest to the Sun?",
    "What is water made of?",
    "How many legs does a spider have?",
    "What is the largest ocean on Earth?",
    "What gas do plants take in from the air?",
    "What is the boiling point of water in Celsius?",
    "Which animal is known as the king of the jungle?",
    "What is the opposite of hot?",
    "How many continents are there?",
    "What language is spoken in Spain?",
    "What do you use to write on a blackboard?",
    "What is frozen water called?",
    "Which season comes after winter?",
    "What is the main ingredient of bread?",
    "How many hours are there in a day?",
    "What does a thermometer measure?",
    "Where does the Sun rise?",
    "What is the tallest animal in the world?",
    "What do cows drink?",
)

MIX_A_TASK = "\n\nContinue this text with a few more sentences in the same style."
MIX_B_TASK = "\n\nQuestion: {question} Answer in one short sentence."


@dataclass(frozen=True)
class ChatPrompt:
    """One chat request: its messages and their token ids under the model's chat template."""

    messages: tuple[dict, ...]
    token_ids: tuple[int, ...]


def render_ids(tokenizer, messages: list[dict]) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def fit_prompt(tokenizer, passage: str, task: str, prompt_tokens: int) -> ChatPrompt:
    """The passage cut (by tokens) so that passage + task renders to `prompt_tokens` tokens, or as close as the
    tokenizer's merges at the cut allow (a few tries, each correcting by the miss)."""
    passage_ids = tokenizer(passage, add_special_tokens=False)["input_ids"]
    keep = max(0, prompt_tokens - len(render_ids(tokenizer, [{"role": "user", "content": task.strip()}])))
    best: ChatPrompt | None = None
    for _ in range(4):
        content = (tokenizer.decode(passage_ids[:keep]).strip() + task).strip()
        messages = ({"role": "user", "content": content},)
        prompt = ChatPrompt(messages, tuple(render_ids(tokenizer, list(messages))))
        if best is None or abs(len(prompt.token_ids) - prompt_tokens) < abs(len(best.token_ids) - prompt_tokens):
            best = prompt
        miss = prompt_tokens - len(prompt.token_ids)
        if miss == 0:
            break
        keep = max(0, keep + miss)
    return best


def chat_prompts(tokenizer, mix: str, count: int, seed: int, prompt_tokens: int = 128) -> list[ChatPrompt]:
    """`count` prompts of one mix ("a" or "b"), seeded."""
    rng = random.Random(f"{seed}-{mix}")
    prompts = []
    for _ in range(count):
        passage = " ".join(rng.sample(SENTENCES, k=len(SENTENCES)))
        task = MIX_A_TASK if mix == "a" else MIX_B_TASK.format(question=rng.choice(QUESTIONS))
        prompts.append(fit_prompt(tokenizer, passage, task, prompt_tokens))
    return prompts
